; vars.asm: the engine's zero-initialised state (bss). Reserved space takes no file bytes.
; Three sections: "forward" (W-fwd: weights, KV cache, activations), "front" (W-front:
; command line, model mapping, tokenizer, sampler, output) and "fast" (W-fast: the threads).
; Keep qwords first, then dwords.

; ---- forward ----------------------------------------------------------------------------
; fwd_vars (rbp in forward.asm) is 96 bytes into the record, so that [rbp + FV_*] reaches
; every field with a one-byte displacement, and model_base (the front's first qword, just
; after the record) and the sections' pointers, ctx_len and logits_fd after it too.
fv_p:           rq 4            ; the op's slot operands: token 0's row (0: none)
fv_st:          rq 4            ; ... and their rows' bytes
fv_att:         rq 1            ; att (BLOCK, ctx + 3): per attention thread, scores then
                                ; probabilities (softmax's lanes past n_t)
fv_logits:      rq 1            ; logits (BLOCK, vocab)
fv_rec:         rq 1            ; the op being run (its record in the program)
fv_ids:         rq 1            ; the block's ids
fwd_vars:
fv_w:           rq 1            ; the op's weight: weights_ptr + w
fv_b:           rd 1            ; B: tokens in this block
fv_pos:         rd 1            ; the block's first position
fv_prompt:      rd 1            ; the prompt's tokens after the block's (signed)
                rd 1            ; (the front's qwords stay 8-aligned)

FV_ATT          = fv_att - fwd_vars
FV_LOGITS       = fv_logits - fwd_vars
FV_REC          = fv_rec - fwd_vars
FV_IDS          = fv_ids - fwd_vars
FV_P            = fv_p - fwd_vars
FV_ST           = fv_st - fwd_vars
FV_W            = fv_w - fwd_vars
FV_B            = fv_b - fwd_vars
FV_POS          = fv_pos - fwd_vars
FV_PROMPT       = fv_prompt - fwd_vars
FV_MODEL_BASE   = model_base - fwd_vars
FV_PROGRAM      = program_ptr - fwd_vars
FV_WEIGHTS      = weights_ptr - fwd_vars
FV_CTX_LEN      = ctx_len - fwd_vars
FV_LOGITS_FD    = logits_fd - fwd_vars

; ---- front ------------------------------------------------------------------------------
; From start-up on the front end keeps rbp = front_base: [rbp + V_*] reaches every variable
; here with a one-byte displacement. Option slots are qwords (opt_table in main.asm).
front_vars:
model_base:     rq 1            ; address of the read-only mapping of the model file (first:
                                ; forward.asm reaches it as [rbp + FV_MODEL_BASE])
slots_ptr:      rq 1            ; model_base + slots_off .. weights_off: the sections, in
program_ptr:    rq 1            ; file order (model.asm's loop stores them so; forward.asm
strings_ptr:    rq 1            ; reaches program_ptr and weights_ptr from fwd_vars too)
pieces_ptr:     rq 1            ; PIECE_REC records
index_ptr:      rq 1            ; u32 normal ids, sorted by bytes
user_ptr:       rq 1            ; u32 user-defined ids, longest first
merges_ptr:     rq 1            ; MERGE_REC records
blob_ptr:       rq 1            ; piece bytes
weights_ptr:    rq 1            ; the weights region
ctx_len:        rd 1            ; context length (from -c or the header)
logits_fd:      rd 1            ; --logits file descriptor (0: none)
opt_model:      rq 1            ; -m path
opt_prompt:     rq 1            ; -p text (default: an empty string, start in main.asm)
opt_logits:     rq 1            ; --logits path (0: none)
rng_state:      rq 1            ; -s, then the generator's state (sample.asm)
opt_n:          rq 1            ; -n, low dword (0xFFFFFFFF: until EOS or a full context)
front_base:
opt_temp:       rq 1            ; --temp, float32 bits in the low dword
opt_top_p:      rq 1            ; --top-p, float32 bits in the low dword
opt_ctx:        rq 1            ; -c, low dword (0: the default)
n_threads:      rq 1            ; -t, low dword (0: not given; threads.asm resolves T from it)
opt_flags:      rq 1            ; the flags, a byte each: --tokens, -h / --help, --baseline,
                                ; --avx2 (cpu.asm), -cnv
opt_file:       rq 1            ; -f path ("-": standard input; 0: none)
sig_block:      rq 1            ; the signals start blocks: {SIGPIPE}
opt_sys:        rq 1            ; -sys text (0: none)
chat_rsp:       rq 1            ; a conversation's stack at each turn (0: no conversation yet)
out_len:        rd 1            ; bytes waiting in out_buf
wrote:          rd 1            ; nonzero once a write succeeded (output.asm: write_all)
fv_cols:        rd 1            ; every product's n or-ed together (check_program; cpu.asm: the
                                ; fast kernels need multiples of 16)
chat_pos:       rd 1            ; a conversation's position at the turn being read
pending:        rd 1            ; a conversation: the id that ended the last reply when the next
                                ; turn must feed it (-n), else -1
stdin_fd:       rd 1            ; where a conversation reads its turns: 0, or -1 (none: a read
                                ; fails) when the model took descriptor 0 (load_model)
out_buf:        rb 256          ; stdout's buffer in its first OUT_BUF_SIZE bytes, flushed after
                                ; every token; all 256 hold the model's and the --logits file's
                                ; struct stat (main.asm LOGITS_STAT) or TCGETS' termios (chat.asm)

V_MODEL         = opt_model - front_base
V_PROMPT        = opt_prompt - front_base
V_LOGITS        = opt_logits - front_base
V_RNG           = rng_state - front_base
V_N             = opt_n - front_base
V_TEMP          = opt_temp - front_base
V_TOP_P         = opt_top_p - front_base
V_CTX           = opt_ctx - front_base
V_THREADS       = n_threads - front_base
V_TOKENS        = opt_flags - front_base
V_HELP          = opt_flags + 1 - front_base
V_BASELINE      = opt_flags + 2 - front_base
V_AVX2          = opt_flags + 3 - front_base
V_CNV           = opt_flags + 4 - front_base
V_SYS           = opt_sys - front_base
V_CHAT_RSP      = chat_rsp - front_base
V_PENDING       = pending - front_base
V_POS           = chat_pos - front_base
V_STDIN         = stdin_fd - front_base
V_STRINGS       = strings_ptr - front_base
V_BASE          = model_base - front_base
V_SLOTS         = slots_ptr - front_base
V_PIECES        = pieces_ptr - front_base
V_INDEX         = index_ptr - front_base
V_USER          = user_ptr - front_base
V_MERGES        = merges_ptr - front_base
V_BLOB          = blob_ptr - front_base
V_CTX_LEN       = ctx_len - front_base
V_LOGITS_FD     = logits_fd - front_base
V_OUT_LEN       = out_len - front_base
V_WROTE         = wrote - front_base
V_COLS          = fv_cols - front_base
V_FILE          = opt_file - front_base
V_SIGSET        = sig_block - front_base
V_OUT_BUF       = out_buf - front_base

; ---- fast (W-fast): the instruction-set level and the threads ----------------------------
; job_vars: the work being shared out (threads.asm): a matrix product, or the attention;
; [job_vars + J_*].
job_vars:
job_share:      rq 1            ; each thread's share: mm_share or att_share (forward.asm)
job_kernel:     rq 1            ; FP16 matrices' kernel record (cpu.asm): the kernel,
job_tokens:     rq 1            ; and the tokens it takes per call at most (KREC_TOKENS)
job_kernel_q8:  rq 1            ; Q8_0 matrices' kernel record
job_tokens_q8:  rq 1
job_call:       rq 1            ; the current product's kernel record: one of the two (par_matmul)
job_rowb:       rq 1            ; the current product's bytes per row of W
job_out:        rq 1            ; xout
job_x:          rq 1            ; x
job_w:          rq 1            ; W
job_gate:       rq 1            ; 0, or hb: then each row of xout done, hb = gelu(hb) * xout
job_n:          rd 1            ; n
job_d:          rd 1            ; d
job_acc:        rd 1            ; accumulate
job_gen:        rd 1            ; products published so far (workers sleep on it)
job_pending:    rd 1            ; workers still busy with the current product
job_t:          rd 1            ; T, the thread count (threads_start)
job_b:          rd 1            ; B: tokens (xout (B,d), x (B,n), row after row)
job_spin:       rd 1            ; wait_change's looks before it sleeps (threads_start)
cpu_mask:       rb 128          ; sched_getaffinity's mask (CPU_MASK_BYTES)

J_CALL          = job_call - job_vars
J_ROWB          = job_rowb - job_vars
J_OUT           = job_out - job_vars
J_X             = job_x - job_vars
J_W             = job_w - job_vars
J_GATE          = job_gate - job_vars
J_N             = job_n - job_vars
J_D             = job_d - job_vars
J_ACC           = job_acc - job_vars
J_GEN           = job_gen - job_vars
J_PENDING       = job_pending - job_vars
J_T             = job_t - job_vars
J_B             = job_b - job_vars
J_SHARE         = job_share - job_vars
KREC_TOKENS     = job_tokens - job_kernel
J_SPIN          = job_spin - job_vars

; ---- the program's slots (forward.asm) ---------------------------------------------------
slot_ptr:       rq 256          ; slot s's buffer (slot 0, none: 0)
slot_cache:     rb 256          ; slot s's flags (SLOT_CACHE: rows by position; SLOT_WRITTEN)
