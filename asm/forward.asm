; forward.asm: the Gemma graph (docs/gemma.md): model_setup lays out the weights and
; buffers once, forward runs a block of 1 .. BLOCK tokens through the layers. Arithmetic
; lives in kernels.asm.
; Registers inside forward: rbx = model header, rbp = fwd_vars (variables as [rbp+FV_*]),
; r12 = the next weight tensor (tensors are read in file order), r13 = the byte offset of
; pos's row in a K or V block (for the q, k, v products), then where the q/k norm weights
; start (each token's rope reads them again), r14 = this layer's K block, r15 = q_h of token
; t in the attention, hb in the feed-forward. What a layer computes follows the header's
; flags (FLAG_QK_NORM, FLAG_POST_NORMS), its window and rope tensors and the header's
; att_scale and soft-caps: Gemma 1, 2 and 3 from the file alone.

BLOCK_SHIFT = 6                 ; 64 tokens: a matrix chunk's first call reads its weights from
BLOCK = 1 shl BLOCK_SHIFT       ; memory, its other 20 from the cache (docs/speed.md); tokens
                                ; per forward call at most (main.asm feeds the prompt so)

; model_setup: derived dimensions, the weights size check, weight and buffer pointers.
; Relies on the header validation in model.asm (dims >= 1, <= 2^16; vocab <= 2^24; layers,
; heads <= 2^10; heads % kv_heads == 0; ctx_len <= max_ctx), so no product below overflows.
;   in: rbx model header (model_base), rbp front_base (ctx_len), n_threads
;   out: fwd_vars set, the kernel chosen (cpu_setup), the workers started (threads_start);
;   fatal "bad header" if weights_size is not the layout's size, "out of memory", "cannot
;   start threads"
;   clobbers: rax rcx rdx rsi rdi r8-r12 xmm0 (preserves the rest)
model_setup:
        push    rbp                     ; (also aligns rsp for the calls)
        mov     r8d, [rbp+V_CTX_LEN]    ; (kept for the KV cache's size below)
        lea     ebp, [rbp+fwd_vars-front_base]  ; fwd_vars (addresses are below 2^32)
        mov     eax, [rbx+HDR_HEAD_DIM]
        mov     ecx, eax
        mul     dword [rbx+HDR_HEADS]   ; (mul: shorter than imul; edx unused)
        mov     [rbp+FV_Q_DIM], eax
        imul    ecx, [rbx+HDR_KV_HEADS]
        mov     [rbp+FV_KV_DIM], ecx
        cdq                             ; (eax < 2^31)
        div     ecx                     ; H hd / (K hd)
        mov     [rbp+FV_GROUP], eax
        shl     ecx, 2
        mov     [rbp+FV_KV_ROW], rcx
        ; weights: embed, layers x (window, rope, [2 q/k norms], 2 or 4 norms, wq wo, wk wv,
        ; gate up down), final norm
        lea     r9, [rbx+HDR_BLOB_SIZE] ; r9: the header's fields past 127 with a disp8
        mov     edx, [r9+HDR_FLAGS-HDR_BLOB_SIZE]
        mov     [rbp+FV_FLAGS], edx     ; (tested with a one-byte displacement)
        mov     ecx, [rbx+HDR_HEAD_DIM]
        push    TENSOR_ALIGN            ; a layer's: its window (one u32)
        pop     rsi
        push    1                       ; rope: hd/2 float32 take the room of hd halves
        pop     rax
        call    tensor_bytes            ; (twice)
        sub     rsi, rax                ; rope
        test    dl, FLAG_QK_NORM
        jz      .norms
        push    2                       ; a q/k norm: hd float32, the room of 2hd halves
        pop     rax
        call    tensor_bytes            ; q_norm, k_norm
.norms:
        mov     ecx, [rbx+HDR_DIM]
        push    2                       ; a norm: d float32 take the room of 2d halves
        pop     rax
        call    tensor_bytes            ; attn_norm, ffn_norm
        test    dl, FLAG_POST_NORMS
        jz      .matrices
        lea     rsi, [rsi+rax*2]        ; post_attn_norm, post_ffn_norm
.matrices:
        mov     rdi, rax                ; final norm
        mov     eax, [rbp+FV_KV_DIM]
        call    matrix_bytes            ; wk
        add     rsi, rax                ; wv
        mov     eax, [rbp+FV_Q_DIM]
        call    matrix_pair             ; wq, wo
        mov     eax, [rbx+HDR_FFN]
        call    matrix_pair             ; up, down
        call    matrix_bytes            ; gate
        mov     eax, [rbx+HDR_LAYERS]
        imul    rsi, rax
        add     rdi, rsi
        mov     eax, [rbx+HDR_VOCAB]
        push    rsi
        call    matrix_bytes            ; embed
        pop     rsi
        add     rdi, rax
        cmp     rdi, [r9+HDR_WEIGHTS_SIZE-HDR_BLOB_SIZE]
        jne     err_header
        mov     rdx, [r9+HDR_WEIGHTS_OFF-HDR_BLOB_SIZE]
        add     rdx, rbx
        mov     [rbp+FV_EMBED], rdx
        add     rdx, rax
        mov     [rbp+FV_LAYER0], rdx
        ; one mapping: 7 scratch vectors of S bytes each (x xb q att hb hb2 logits), then the
        ; KV cache: per layer a K and a V block of ctx_len rows of kv_dim float32
        mov     eax, [rbx+HDR_DIM]
        add     eax, [rbp+FV_Q_DIM]
        add     eax, [rbx+HDR_FFN]
        add     eax, r8d                ; ctx_len
        add     eax, [rbx+HDR_VOCAB]
        add     eax, 15
        and     al, -16
        shl     eax, 2 + BLOCK_SHIFT    ; S: holds any vector for a block, a multiple of 64
        imul    r8, [rbp+FV_KV_ROW]
        mov     [rbp+FV_KV_BLOCK], r8
        mov     edx, [rbx+HDR_LAYERS]
        imul    rdx, r8
        imul    rdi, rax, 7
        lea     rdi, [rdi+rdx*2]
        mov     r12, rax                ; S
        call    alloc
        lea     rdi, [rbp+FV_X]         ; (fwd_vars is 32 bytes into the record: vars.asm)
        push    8
        pop     rcx
.pointer:
        stosq                           ; FV_X, FV_XB, ..., FV_LOGITS, FV_KV
        add     rax, r12
        loop    .pointer
        call    cpu_setup               ; the kernel (cpu.asm; keeps rbx)
        call    threads_start           ; the workers (threads.asm; keeps rbx)
        pop     rbp
        ret

; forward: a block of B tokens at positions pos .. pos+B-1 through the model, layer by layer:
; every matrix product reads its weights once for the whole block (threads.asm); norms, rope
; and attention run token by token, token t attending positions 0 .. pos+t (its own K and V
; rows and the block's earlier ones are in the cache by then). Each logit is computed by the
; same float32 operations whatever B is. Positions must continue the cache: pos = the number
; of tokens fed before.
;   in: rsi ids (B u32 tokens, each < vocab), ecx pos, edx B (1 .. BLOCK, pos + B <= ctx_len),
;   r8d the prompt's length
;   out: the logits (float32, vocab a row): every row with --logits (logits_fd); else the
;   last row, and none at all for a block that ends before the prompt does (then rax rsi
;   edx undefined); rax -> the last row, rsi -> the rows written, edx = their bytes
;   clobbers: rcx rdi r8-r11 xmm0-xmm15 (preserves rbx rbp r12-r15)
forward:
        call    fwd_frame               ; [rsp]: the prompt's length (r8)
        mov     [rbp+FV_B], edx
        mov     [rbp+FV_POS], ecx
        lea     eax, [rcx+rdx]
        mov     [rbp+FV_N_T], eax       ; pos + B: where the token loops end
        xor     r9d, r9d
        mov     r15, [rbp+FV_X]         ; x_t
        mov     r14d, edx               ; tokens left
        mov     ecx, [rbx+HDR_DIM]
        push    rsi
        call    matrix_bytes            ; r10: an embedding row's bytes, rdx: its lookup
        pop     rsi
        mov     r13, r10
        mov     r12, rdx
.embed:
        mov     r8d, [rbx+HDR_DIM]
        lodsd                           ; token t
        imul    rax, r13
        mov     rdx, [rbp+FV_EMBED]
        add     rdx, rax
        mov     rdi, r15
        lea     r15, [r15+r8*4]
        push    1
        pop     rcx
        push    rsi                     ; ids (twice: rsp stays 16-aligned)
        push    rsi
        lea     rsi, [rbx+HDR_EMBED_SCALE]
        call    r12                     ; x_t = embed[token t] embed_scale (keeps r9)
        pop     rsi
        pop     rsi
        dec     r14d
        jnz     .embed
        mov     r12, [rbp+FV_LAYER0]
        mov     r14, [rbp+FV_KV]
        mov     eax, [rbx+HDR_LAYERS]
        mov     [rbp+FV_LAYERS_LEFT], eax
.layer:
        mov     eax, [r12]              ; window: w (0: none)
        dec     eax
        mov     [rbp+FV_WINDOW], eax    ; w - 1 (no window: 2^32 - 1)
        add     r12, TENSOR_ALIGN       ; rope, after the window's room
        mov     [rbp+FV_ROPE], r12
        mov     ecx, [rbx+HDR_HEAD_DIM]
        shr     ecx, 1
        call    fwd_skip                ; past rope's hd/2 float32
        call    fwd_norm                ; xb = rmsnorm(x, attn_norm)
        mov     r13d, [rbp+FV_POS]
        imul    r13, [rbp+FV_KV_ROW]    ; pos's row in a K or V block
        mov     r15, [rbp+FV_Q]         ; q_h of token t: runs over the whole of q
        mov     rdi, r15
        mov     r8d, [rbp+FV_Q_DIM]
        call    fwd_matmul_xb           ; q = wq @ xb
        lea     rdi, [r14+r13]
        mov     r8d, [rbp+FV_KV_DIM]
        call    fwd_matmul_xb           ; k = wk @ xb, into the K cache at pos ..
        lea     rdi, [r14+r13]
        add     rdi, [rbp+FV_KV_BLOCK]
        mov     r8d, [rbp+FV_KV_DIM]
        call    fwd_matmul_xb           ; v = wv @ xb, into the V cache at pos ..
        mov     r13, r12                ; q_norm, k_norm (FLAG_QK_NORM), or wo
        mov     ecx, [rbp+FV_POS]       ; pos + t
.token:
        call    fwd_ropes               ; q_t, k_t = rope(norm(q_t)), rope(norm(k_t)); keeps
        mov     eax, [rbp+FV_Q_DIM]     ; ecx; r12 past the q/k norms (if any): wo
        lea     r15, [r15+rax*4]        ; the next q_t
        inc     ecx
        cmp     ecx, [rbp+FV_N_T]
        jb      .token
        mov     [rbp+FV_KLAYER], r14
        mov     eax, att_share          ; (addresses are below 2^32)
        call    par_run                 ; xb_h = attention of every token and head (threads)
        mov     rsi, [rbp+FV_XB]
        mov     ecx, [rbp+FV_Q_DIM]
        call    fwd_residual            ; x += [rmsnorm](wo @ xb, post_attn_norm)
        call    fwd_norm                ; xb = rmsnorm(x, ffn_norm)
        mov     r15, [rbp+FV_HB]
        mov     rdi, r15
        mov     r8d, [rbx+HDR_FFN]
        call    fwd_matmul_xb           ; hb = gate @ xb
        mov     [job_gate], r15
        mov     rdi, [rbp+FV_HB2]
        mov     r8d, [rbx+HDR_FFN]
        call    fwd_matmul_xb           ; hb2 = up @ xb, then hb = gelu_tanh(hb) * hb2 (and
                                        ; job_gate = 0 again)
        mov     rsi, r15
        mov     ecx, [rbx+HDR_FFN]
        call    fwd_residual            ; x += [rmsnorm](down @ hb, post_ffn_norm)
        add     r14, [rbp+FV_KV_BLOCK]
        add     r14, [rbp+FV_KV_BLOCK]  ; the next layer's K block
        dec     dword [rbp+FV_LAYERS_LEFT]
        jnz     .layer
        call    fwd_norm                ; xb = rmsnorm(x, final_norm); rdi: the last token's
        mov     rsi, rdi
        mov     rdi, [rbp+FV_LOGITS]
        mov     r12, [rbp+FV_EMBED]
        mov     r8d, [rbx+HDR_VOCAB]
        mov     eax, [rbp+FV_B]
        dec     eax
        mul     r8d                     ; (edx: 0)
        lea     rdx, [rdi+rax*4]        ; the last token's row (all sampling needs)
        cmp     dword [logits_fd], 0
        jne     .all                    ; --logits: every token's row
        mov     eax, [rbp+FV_N_T]       ; pos + B
        cmp     eax, [rsp]
        jb      .done                   ; a block before the prompt's end: none
        mov     rdi, rdx                ; else the last token's alone
        mov     byte [rbp+FV_B], 1      ; (B <= BLOCK: the upper bytes are 0)
        jmp     .logits
.all:
        mov     rsi, [rbp+FV_XB]
.logits:
        push    rdx                     ; the last row
        push    rdi                     ; the first row written
        call    fwd_matmul              ; logits = embed (vocab,d) @ xb
        pop     rdi
        mov     esi, [rbx+HDR_VOCAB]
        imul    esi, [rbp+FV_B]         ; the rows written (FV_B: 1 without --logits)
        mov     eax, [rbx+HDR_FINAL_SOFTCAP]
        test    eax, eax
        jz      .capped
        movd    xmm1, eax
        movss   xmm0, [gelu_c+GC_ONE]   ; 1.0 (kernels.asm)
        call    softcap                 ; logits = c tanh(logits / c); keeps rdi rsi
.capped:
        pop     rax                     ; -> the last row
        shl     esi, 2
        mov     edx, esi                ; bytes of the rows written
        mov     rsi, rdi                ; -> the first of them
.done:
        pop     rcx
        pop     r15
        pop     r14
        pop     r13
        pop     r12
        pop     rbp
        pop     rbx
        ret

; The helpers below use forward's registers (rbx rbp r12 r13 r14 r15) and clobber as the kernel
; they end in.

; fwd_norm: xb_t = rmsnorm(x_t, w) for every token t of the block, w the d float32 at r12.
;   in: rbx header, rbp fwd_vars, r12 w   out: xb; rdi the last token's xb, ecx d; r12 past
;   w (64-byte aligned)
;   clobbers: rax rcx rdx rsi rdi r8 r10 xmm0
fwd_norm:
        mov     rdi, [rbp+FV_XB]
        mov     rsi, [rbp+FV_X]
        xor     r8d, r8d
; fwd_norm_rows: dst_t (+)= rmsnorm(src_t, w) for every token t (rows of d floats).
;   in: rdi dst, rsi src, r8d accumulate
fwd_norm_rows:
        mov     ecx, [rbx+HDR_DIM]
        mov     r10d, [rbp+FV_B]
; norm_rows: r10d rows of ecx floats each (the same for dst and src): dst_i (+)= rmsnorm(src_i,
; w), w the ecx float32 at r12 (r12 then moves past it).   in: rdi dst, rsi src, r10d >= 1
norm_rows:
        movss   xmm0, [rbx+HDR_EPS]
        mov     rdx, r12
.row:
        call    rmsnorm                 ; (keeps all but rax)
        dec     r10d
        jz      fwd_skip
        lea     rdi, [rdi+rcx*4]
        lea     rsi, [rsi+rcx*4]
        jmp     .row
; fwd_skip: r12 past ecx float32 (to the next tensor: a multiple of TENSOR_ALIGN).
fwd_skip:
        lea     r12, [r12+rcx*4+TENSOR_ALIGN-1]
        and     r12, -TENSOR_ALIGN
        ret

; fwd_residual: x += W (d,n) @ src (n,), W at r12; with FLAG_POST_NORMS x += rmsnorm(W @ src,
; w) instead, w the d float32 after W (the product goes through hb2).   in: rsi src, ecx n
fwd_residual:
        mov     r8d, [rbx+HDR_DIM]
        test    byte [rbp+FV_FLAGS], FLAG_POST_NORMS
        jnz     .post
        mov     rdi, [rbp+FV_X]
        mov     r9b, 1
        jmp     fwd_matmul.w
.post:
        mov     rdi, [rbp+FV_HB2]
        push    rdi                     ; (aligns rsp for the call)
        call    fwd_matmul              ; hb2 = W @ src
        pop     rsi
        mov     rdi, [rbp+FV_X]
        mov     r8b, 1
        jmp     fwd_norm_rows           ; x += rmsnorm(hb2, w)
; fwd_matmul_xb: xout = W (rows,d) @ xb (d,), W at r12.   in: rdi xout, r8d rows
fwd_matmul_xb:
        mov     rsi, [rbp+FV_XB]
        mov     ecx, [rbx+HDR_DIM]
; fwd_matmul: xout = W (rows,n) @ x (n,), W at r12; r12 moves past W. Every matrix product
; of the forward pass goes through here, on to par_matmul (threads.asm: rows split over the
; threads, each share by the kernel cpu_setup chose for W's type: FP16 or Q8_0).
;   in: rdi xout, rsi x, ecx n (rcx's upper half zero), r8d rows
fwd_matmul:
        xor     r9d, r9d
.w:
        mov     eax, r8d
        push    rsi                     ; (aligns rsp for the call)
        call    matrix_bytes            ; W's room, row bytes, kernel
        pop     rsi
        mov     rdx, r12
        add     r12, rax
        mov     eax, [rbp+FV_B]
        jmp     par_matmul              ; threads.asm

; fwd_ropes: q_t, k_t = rope(norm(q_t)), rope(norm(k_t)): q_t's H heads, k_t's K heads (in
; the K cache) at position pos, in one rope call; the norms (FLAG_QK_NORM) read q_norm, k_norm
; from r13.
;   in: r15 q_t, r14 K block, ecx pos (kept), r13   out: r12 past k_norm (r13 without them)
fwd_ropes:
        mov     r12, r13
        push    rcx
        mov     rdi, r15
        mov     esi, [rbx+HDR_HEADS]
        call    fwd_qk_norm
        mov     eax, [rsp]
        mul     qword [rbp+FV_KV_ROW]   ; (rdx: free here)
        lea     rdi, [r14+rax]          ; k_t
        mov     esi, [rbx+HDR_KV_HEADS]
        call    fwd_qk_norm
        push    rax                     ; (aligns rsp for rope)
        push    rsi                     ; rope's n2
        mov     r9, rdi
        mov     rdi, r15
        mov     esi, [rbx+HDR_HEADS]
        mov     edx, [rbx+HDR_HEAD_DIM]
        mov     r8, [rbp+FV_ROPE]
        mov     ecx, [rsp+16]           ; pos
        call    rope
        pop     rax
        pop     rax
        pop     rcx
        ret
; fwd_qk_norm: with FLAG_QK_NORM each of the n heads of x = rmsnorm(head, the hd float32 at
; r12), r12 past them.
;   in: rdi x, esi n (both kept)   clobbers: rax rcx rdx r8 r10 xmm0
fwd_qk_norm:
        test    byte [rbp+FV_FLAGS], FLAG_QK_NORM
        jz      .ret
        push    rsi
        push    rdi
        mov     r10d, esi
        mov     rsi, rdi
        mov     ecx, [rbx+HDR_HEAD_DIM]
        xor     r8d, r8d
        call    norm_rows               ; every head, in place
        pop     rdi
        pop     rsi
.ret:
        ret

; att_share: thread k's attention tasks of the block forward published (a share function of
; par_run, threads.asm). Task i = t H + h (token t, query head h of kv head g = h / group),
; i in [k c, min(B H, (k+1) c)), c = ceil(B H / min(T, BLOCK)): att = K_g (n_t,hd) @ q_h
; over the positions attended, the last n_t = pos + t + 1 (the block's earlier rows are in
; the cache, roped), or the last min(n_t, w) with the layer's window w > 0 (from position
; n_t - w: never outside the cache), att = softmax(softcap(att att_scale)), o_h = V_g^T att
; into xb (where q_h is in q). Thread k's att is att + k (ctx + 3) floats (softmax's lanes
; past n_t; room for BLOCK threads; threads k >= BLOCK get no tasks). Each task as one
; thread would.
;   in: esi k (rbx job_vars: unused)   out: o_h of those tasks
;   clobbers: rax rcx rdx rsi rdi r8-r11 xmm0-xmm5 (keeps rbx rbp r12-r15)
att_share:
        call    fwd_frame
        mov     eax, [ctx_len]
        add     eax, MATVEC_LANES - 1   ; (softmax's lanes past n_t)
        mul     esi                     ; (edx: free here)
        mov     r15, [rbp+FV_ATT]
        lea     r15, [r15+rax*4]        ; thread k's att
        mov     ecx, [job_t]
        push    BLOCK
        pop     rax
        cmp     ecx, eax
        cmova   ecx, eax                ; min(T, BLOCK)
        mov     r14d, [rbp+FV_B]
        imul    r14d, [rbx+HDR_HEADS]   ; B H tasks
        lea     eax, [r14+rcx-1]
        cdq                             ; (eax < 2^31)
        div     ecx                     ; c
        imul    esi, eax
        mov     r12d, esi               ; i = k c
        add     eax, esi
        cmp     r14d, eax
        cmova   r14d, eax               ; the end: min(B H, (k+1) c)
.task:
        cmp     r12d, r14d
        jae     forward.done            ; the same pushes: forward's epilogue
        mov     eax, r12d
        cdq                             ; (i < 2^31)
        div     dword [rbx+HDR_HEADS]   ; t, h
        add     eax, [rbp+FV_POS]
        inc     eax
        mov     r13d, eax               ; n_t
        xchg    eax, edx
        cdq
        div     dword [rbp+FV_GROUP]    ; g
        mov     ecx, [rbx+HDR_HEAD_DIM]
        mul     ecx                     ; (edx: free here)
        mov     rdx, [rbp+FV_KLAYER]
        lea     rdx, [rdx+rax*4]        ; K_g
        lea     eax, [r13-1]            ; pos + t
        sub     eax, [rbp+FV_WINDOW]    ; - (w - 1): the first position attended, when > 0
        jbe     .all
        sub     r13d, eax               ; n_t: the w positions from there
        imul    rax, [rbp+FV_KV_ROW]
        add     rdx, rax                ; K_g from there
.all:
        push    rdx                     ; (with rax: rsp stays 16-aligned for the calls)
        mov     eax, r12d
        imul    eax, ecx                ; i hd: q_h's and o_h's offset in floats
        push    rax
        mov     rsi, [rbp+FV_Q]
        lea     rsi, [rsi+rax*4]        ; q_h
        mov     rdi, r15
        mov     r8d, r13d
        mov     r9, [rbp+FV_KV_ROW]
        call    matvec_f32              ; att = K_g (n_t,hd) @ q_h; keeps ecx
        mov     r8d, ecx                ; hd
        mov     rdi, r15
        mov     esi, r13d
        movss   xmm0, [rbx+HDR_ATT_SCALE]
        movss   xmm1, [rbx+HDR_ATT_SOFTCAP]
        call    softcap                 ; att = cap(att att_scale); keeps rdi rsi r8
        call    softmax                 ; att = softmax(att); keeps rdi rsi r8
        pop     rax
        pop     rdx
        add     rdx, [rbp+FV_KV_BLOCK]  ; V_g
        mov     ecx, esi
        mov     rsi, rdi
        mov     rdi, [rbp+FV_XB]
        lea     rdi, [rdi+rax*4]        ; o_h
        mov     r9, [rbp+FV_KV_ROW]
        call    matvec_t_f32            ; o_h = V_g^T (hd,n_t) @ att
        inc     r12d
        jmp     .task

; fwd_frame: the frame forward and att_share share (both leave through forward.done): pushes
; rbx rbp r12-r15 and r8 (so rsp is 16-aligned for calls when the caller's was 8 mod 16).
;   in: called first thing   out: rbp fwd_vars, rbx model header   clobbers: r11
fwd_frame:
        pop     r11                     ; the return address
        push    rbx
        push    rbp
        push    r12
        push    r13
        push    r14
        push    r15
        push    r8
        lea     rbp, [fwd_vars]
        mov     rbx, [rbp+FV_MODEL_BASE]        ; (model_base: a disp8 from fwd_vars)
        jmp     r11

; matrix_pair: matrix_bytes of (rows, cols), then of (cols, rows), both added to rsi.
;   in: eax rows, ecx cols, rbp fwd_vars, rsi   out: rsi (eax, ecx kept)   clobbers: rdx r10 r11
matrix_pair:
        push    rax
        push    rcx
        call    matrix_bytes
        pop     rax                     ; cols
        pop     rcx                     ; rows
        push    rcx
        push    rax
        call    matrix_bytes            ; the transposed
        pop     rcx
        pop     rax
        ret

; matrix_bytes: the room a (rows, cols) matrix takes in the weights, padding included (FP16,
; or Q8_0 blocks when the header has FLAG_Q8_0 and cols is a multiple of QK8_0), added to
; rsi; its bytes per row, its kernel (cpu.asm's choice for that type) and the routine that
; looks up a row of it (the embedding: matmul_f16 of the row as a (cols,1) column by [s], or
; dequant_q8).
;   in: eax rows, ecx cols (upper halves zero), rbp fwd_vars (FV_FLAGS), rsi
;   out: rax the room, rsi + rax, r10 bytes per row, r11 its kernel record (vars.asm), rdx
;   the lookup
;   clobbers: nothing else
matrix_bytes:
        lea     r10d, [rcx+rcx]         ; FP16: 2 bytes a weight
        mov     r11d, job_kernel        ; (addresses are below 2^32)
        mov     edx, matmul_f16         ; (addresses are below 2^32)
        test    byte [rbp+FV_FLAGS], FLAG_Q8_0
        jz      .room
        test    cl, QK8_0-1
        jnz     .room
        imul    r10d, ecx, Q8_0_BLOCK / 2   ; Q8_0: Q8_0_BLOCK bytes per QK8_0 weights,
        shr     r10d, 4                 ; cols * 17 / 16 (exact: cols is a multiple of 32)
        mov     r11d, job_kernel_q8
        mov     edx, dequant_q8
.room:
        imul    rax, r10
        add     rax, TENSOR_ALIGN-1
        and     al, -TENSOR_ALIGN       ; (the upper bytes: unchanged, as by and rax)
        add     rsi, rax
        ret

; tensor_bytes: the room a (rows, cols) f16 tensor takes in the weights, padding included,
; added twice to rsi (a pair of such tensors).
;   in: eax rows, ecx cols (upper halves zero), rsi   out: rax; rsi + 2 rax
;   clobbers: nothing else
tensor_bytes:
        imul    rax, rcx
        lea     rax, [rax*2+TENSOR_ALIGN-1]
        and     al, -TENSOR_ALIGN       ; (the upper bytes: unchanged, as by and rax)
        lea     rsi, [rsi+rax*2]
        ret
