; vars.asm: the engine's zero-initialised state (bss). Reserved space takes no file bytes.
; Two sections: "front" (W-front: command line, model mapping, tokenizer, sampler, output)
; and "forward" (W-fwd: weights, KV cache, activations). Keep qwords first, then dwords.

; ---- front ------------------------------------------------------------------------------
; Command-line options: one qword slot each, in the order of opt_table (main.asm), which
; addresses them by their offset from `options`.
options:
opt_model:      rq 1            ; -m path
opt_prompt:     rq 1            ; -p text (0: empty prompt)
opt_logits:     rq 1            ; --logits path (0: none)
opt_seed:       rq 1            ; -s
opt_n:          rq 1            ; -n, low dword (default 0xFFFFFFFF: until EOS or context full)
opt_temp:       rq 1            ; --temp, float32 bits in the low dword
opt_top_p:      rq 1            ; --top-p, float32 bits in the low dword
opt_ctx:        rq 1            ; -c, low dword (0: the default)
n_threads:      rq 1            ; -t, low dword (dword variable of CONTRACTS.md)
opt_tokens:     rq 1            ; --tokens, low byte

model_base:     rq 1            ; address of the read-only mapping of the model file
model_size:     rq 1            ; its length in bytes
pieces_ptr:     rq 1            ; model_base + pieces_off (PIECE_REC records)
index_ptr:      rq 1            ; model_base + index_off (u32 normal ids, sorted by bytes)
user_ptr:       rq 1            ; model_base + user_off (u32 user-defined ids, longest first)
blob_ptr:       rq 1            ; model_base + blob_off (piece bytes)
rng_state:      rq 1            ; xorshift64* state
ctx_len:        rd 1            ; context length (from -c or the header)
logits_fd:      rd 1            ; --logits file descriptor (0: none)
out_len:        rd 1            ; bytes waiting in out_buf
out_buf:        rb 256          ; stdout buffer, flushed after every token

; ---- forward ----------------------------------------------------------------------------
