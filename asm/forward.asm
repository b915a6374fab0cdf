; forward.asm: the interpreter of the model file's program (docs/format.md, "Version 4"):
; forward runs a block of 1 .. BLOCK tokens through every op in order, each op by its
; handler below; the arithmetic lives in kernels.asm, the products and the attention are
; split over the threads (threads.asm). The engine knows no Gemma: what a generation
; computes is its program. program.asm validates it and lays out the buffers.
; Registers inside forward and its handlers: rbx = model header, rbp = fwd_vars (variables as
; [rbp+FV_*]), r13 = the op's record; a handler finds its slot operands' rows in FV_P and
; FV_ST (token 0's row of s0 .. s3, 0 for none: a CACHE slot's row of position pos, but
; position 0 for ATTN's K and V (OPW_KV); their rows' bytes) and its weight at FV_W
; (and in rdx when it runs once per block).

BLOCK_SHIFT = 6                 ; 64 tokens: a matrix chunk's first call reads its weights from
BLOCK = 1 shl BLOCK_SHIFT       ; memory, its other 20 from the cache (docs/speed.md); tokens
                                ; per forward call at most (main.asm feeds the prompt so)

; forward: a block of B tokens at positions pos .. pos+B-1 through the program: every op
; treats the whole block (a product reads its weights once for it); EMBED and ROPE run token
; by token, the attention by (token, head), token t attending positions 0 .. pos+t (its own
; K and V rows and the block's earlier ones are in the cache by then). Each logit is computed
; by the same float32 operations whatever B is. Positions must continue the cache: pos = the
; number of tokens fed before.
;   in: rsi ids (B u32 tokens, each < vocab), ecx pos, edx B (1 .. BLOCK, pos + B <= ctx_len),
;   r8d the prompt's length
;   out: the logits (float32, vocab a row): every token's row with --logits (logits_fd);
;   else the last token's, and none at all for a block that ends before the prompt does
;   (then rax rsi edx undefined); rax -> the last row written, rsi -> the rows written,
;   edx = their bytes
;   clobbers: rcx rdi r8-r11 xmm0-xmm15 (preserves rbx rbp r12-r15)
forward:
        call    fwd_frame
        mov     [rbp+FV_IDS], rsi
        mov     [rbp+FV_POS], ecx
        mov     [rbp+FV_B], edx
        add     ecx, edx
        sub     r8d, ecx
        mov     [rbp+FV_PROMPT], r8d    ; the prompt's tokens after the block's (< 0: none)
        mov     r13, [rbp+FV_PROGRAM]
        mov     r12d, [rbx+HDR_N_OPS]
.op:
        mov     [rbp+FV_REC], r13
        mov     eax, [r13+OP_OP]
        lea     r14, [op_table-8+rax*8]
        push    -4
        pop     r15
.operand:                       ; s0 .. s3 (r15 = -4 .. -1): token 0's row, the rows' bytes
        call    op_width
        shl     edx, 2                  ; (<= MAX_WIDTH floats: check_program)
        mov     [rbp+FV_ST+32+r15*8], rdx
        movzx   ecx, byte [r13+OP_S0+4+r15]
        test    al, OPW_KV              ; (eax: the operand's code)
        mov     rax, [slot_ptr+rcx*8]
        jnz     .row                    ; ATTN's K and V: from position 0
        test    byte [slot_cache+rcx], SLOT_CACHE
        jz      .row
        mov     esi, [rbp+FV_POS]       ; a cache's rows go by position
        imul    rsi, rdx
        add     rax, rsi
.row:
        mov     [rbp+FV_P+32+r15*8], rax
        inc     r15
        jnz     .operand
        mov     rdx, [rbp+FV_WEIGHTS]
        add     rdx, [r13+OP_W]
        mov     [rbp+FV_W], rdx
        movzx   eax, word [r14+6]
        add     eax, h_embed            ; the handler (addresses are below 2^32)
        mov     rdi, [rbp+FV_P]
        mov     rsi, [rbp+FV_P+8]
        test    byte [r14+5], OPT_TOKEN
        jnz     .tokens
        mov     ecx, [r13+OP_N]
        imul    ecx, [rbp+FV_B]
        call    rax                     ; rdi s0, rsi s1, rdx W, ecx n B
        jmp     .next
.tokens:
        mov     r14, rax                ; (r15 = 0 from the operands' loop: t)
.token:
        mov     ecx, [rbp+FV_POS]
        add     ecx, r15d
        push    rdi
        push    rsi
        call    r14                     ; rdi s0_t, rsi s1_t, ecx pos + t, r15d t
        pop     rsi
        pop     rdi
        add     rdi, [rbp+FV_ST]
        add     rsi, [rbp+FV_ST+8]
        inc     r15d
        cmp     r15d, [rbp+FV_B]
        jb      .token
.next:
        add     r13, OP_REC
        dec     r12d
        jnz     .op                     ; (after LOGITS, the last: its rax rsi edx)
.done:
        pop     rcx
        pop     r15
        pop     r14
        pop     r13
        pop     r12
        pop     rbp
        pop     rbx
        ret

; The handlers: in: r13 the op, rbx rbp as forward's; FV_P, FV_ST, FV_W the op's operands;
; per block (OPT_TOKEN clear) rdi = s0's rows, rsi = s1's, rdx = W, ecx = n B; per token
; rdi = s0_t, rsi = s1_t, ecx = pos + t, r15d = t. Each keeps rbx rbp r12-r15 and clobbers
; as the kernel it ends in.

; h_embed: EMBED, s0_t = row id_t of the table (columns j .. j+n-1 of k) * a.
h_embed:
        mov     rax, [rbp+FV_IDS]
        mov     esi, [rax+r15*4]        ; id_t
        mov     ecx, [r13+OP_K]
        call    weight_row              ; a row's bytes, the lookup
        imul    rsi, r10
        add     rsi, [rbp+FV_W]         ; -> row id_t
        mov     ecx, [r13+OP_J]
        call    weight_row              ; j's bytes
        lea     rdx, [rsi+r10]          ; -> column j of row id_t
        lea     rsi, [r13+OP_A]         ; [a]
        push    1                       ; the row as an (n,1) column
        pop     rcx
        mov     r8d, [r13+OP_N]
        xor     r9d, r9d
        jmp     rax

; h_norm: NORM, s0_t[g] (+)= rmsnorm(s1_t[g], w) for the m groups of n floats of each token,
; eps a (the groups of all tokens follow each other: m B of them).
h_norm:
        mov     ecx, [r13+OP_N]
        mov     r10d, [r13+OP_M]
        imul    r10d, [rbp+FV_B]
        mov     r8d, [r13+OP_FLAGS]
        and     r8d, OPF_ACC
        movss   xmm0, [r13+OP_A]
.group:
        call    rmsnorm                 ; (keeps all but rax)
        lea     rdi, [rdi+rcx*4]
        lea     rsi, [rsi+rcx*4]
        dec     r10d
        jnz     .group
        ret

; h_matmul: MATMUL, s0_t (+)= W (m,n) @ s1_t; with s2 (a gate) then s2_t = gelu_tanh(s2_t) *
; s0_t. Rows split over the threads (par_matmul).
h_matmul:
        mov     rax, [rbp+FV_P+16]
        mov     [job_gate], rax         ; 0: none
        mov     ecx, [r13+OP_N]
        call    weight_row              ; r10 bytes per row, r11 its kernel
        mov     r8d, [r13+OP_M]
        mov     r9d, [r13+OP_FLAGS]
        and     r9d, OPF_ACC
        mov     eax, [rbp+FV_B]
        jmp     par_matmul

; h_rope: ROPE, the m heads of s0_t and the k of s1_t rotated by position pos + t, with the n/2
; inverse frequencies at W.
h_rope:
        mov     r9, rsi
        mov     esi, [r13+OP_M]
        mov     edx, [r13+OP_N]
        mov     r8, [rbp+FV_W]
        push    qword [r13+OP_K]        ; rope's n2: k (the low dword; rsp aligned for it)
        call    rope
        pop     rax
        ret

; h_attn: ATTN, every (token, head) of the block over the threads (att_share), K's and V's
; rows by position from 0.
h_attn:
        mov     eax, att_share          ; (addresses are below 2^32)
        jmp     par_run

; h_scale: SCALE, s0 = s0 * a over the block's n B values (softcap without a cap: each
; product rounded once).
h_scale:
        mov     esi, ecx
        movss   xmm0, [r13+OP_A]
        xorps   xmm1, xmm1
        jmp     softcap

; h_add: ADD, s0 = s0 + s1 over the block's n B values.
h_add:
        movss   xmm0, [rdi+rcx*4-4]
        addss   xmm0, [rsi+rcx*4-4]
        movss   [rdi+rcx*4-4], xmm0
        loop    h_add
        ret

; h_geglu: GEGLU, s0 = gelu_tanh(s0) * s1 over the block's n B values.
h_geglu:
        mov     edx, ecx
        jmp     geglu

; h_logits: LOGITS, logits_t = softcap(W (vocab,n) @ s1_t, c): every token's row with
; --logits, else the last token's alone (in the first row), and none for a block that ends
; before the prompt does. It is the program's last op: forward returns what it leaves in rax
; (-> the last row written), rsi (-> the first) and edx (the bytes written).
h_logits:
        mov     ecx, [r13+OP_N]
        call    weight_row              ; r10 bytes per row, r11 its kernel
        mov     r8d, [rbx+HDR_VOCAB]
        mov     eax, [rbp+FV_B]
        mov     rdi, [rbp+FV_LOGITS]
        cmp     dword [rbp+FV_LOGITS_FD], 0
        jne     .rows                   ; --logits: every token's row
        cmp     dword [rbp+FV_PROMPT], 0
        jg      .ret                    ; a block before the prompt's end: none
        dec     eax
        imul    rax, [rbp+FV_ST+8]
        add     rsi, rax                ; the last token's s1 (its logits: the first row)
        push    1
        pop     rax
.rows:
        push    rdi
        push    rax
        push    rax                     ; the rows (twice: rsp 16-aligned for the calls)
        xor     r9d, r9d
        call    par_matmul              ; logits = W (vocab,n) @ s1
        pop     rsi
        pop     rsi
        imul    esi, [rbx+HDR_VOCAB]    ; the floats written
        pop     rdi
        mov     eax, [r13+OP_C]
        test    eax, eax
        jz      .capped
        movd    xmm1, eax
        movss   xmm0, [gelu_c+GC_ONE]   ; 1.0 (kernels.asm)
        call    softcap                 ; logits = c tanh(logits / c); keeps rdi rsi
.capped:
        imul    edx, esi, 4             ; (64 vocab 4 < 2^32: vocab < 2^24, check_header)
        imul    ecx, [rbx+HDR_VOCAB], 4
        lea     rax, [rdi+rdx]
        sub     rax, rcx                ; the last row
        mov     rsi, rdi
.ret:
        ret

; att_share: thread k's attention tasks of the ATTN op forward runs (a share function of
; par_run, threads.asm; the op's record at FV_REC: n = hd, m = H query heads, a the scale,
; c the soft-cap). Task i = t H + h (token t, query head h of kv head g = h / (m / k)), i in
; [k c, min(B H, (k+1) c)), c = ceil(B H / min(T, BLOCK)): att = K_g (n_t,hd) @ q_h over the
; positions attended, the last n_t = pos + t + 1 (the block's earlier rows are in the cache,
; roped), or the last min(n_t, w) with the window w > 0 (from position n_t - w: never
; outside the cache), att = softmax(softcap(att a, c)), o_h = V_g^T att into s0 (s1: q).
; Thread k's att is att + k (ctx + 3) floats (softmax's lanes past n_t; room for BLOCK
; threads; threads k >= BLOCK get no tasks). Each task as one thread would.
;   in: esi k (rbx job_vars: unused)   out: o_h of those tasks
;   clobbers: rax rcx rdx rsi rdi r8-r11 xmm0-xmm5 (keeps rbx rbp r12-r15)
att_share:
        call    fwd_frame
        mov     rbx, [rbp+FV_REC]       ; the op
        mov     eax, [rbp+FV_CTX_LEN]
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
        imul    r14d, [rbx+OP_M]        ; B H tasks
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
        div     dword [rbx+OP_M]        ; t, h
        add     eax, [rbp+FV_POS]
        inc     eax
        mov     r13d, eax               ; n_t
        xchg    eax, edx
        mul     dword [rbx+OP_K]
        div     dword [rbx+OP_M]        ; g = h k / m = h / (m / k) (k divides m)
        mov     ecx, [rbx+OP_N]         ; hd
        mul     ecx                     ; (edx: free here)
        imul    edx, eax, 4             ; K_g's and V_g's offset in their caches
        lea     eax, [r13-1]            ; pos + t
        mov     esi, [rbx+OP_J]
        dec     esi                     ; w - 1 (no window, w = 0: 2^32 - 1)
        sub     eax, esi                ; the first position attended, when > 0
        jbe     .all
        sub     r13d, eax               ; n_t: the w positions from there
        imul    rax, [rbp+FV_ST+16]
        add     rdx, rax                ; from there
.all:
        push    rdx                     ; (with rax: rsp stays 16-aligned for the calls)
        mov     eax, r12d
        imul    eax, ecx                ; i hd: q_h's and o_h's offset in floats
        push    rax
        mov     rsi, [rbp+FV_P+8]
        lea     rsi, [rsi+rax*4]        ; q_h
        add     rdx, [rbp+FV_P+16]      ; K_g
        mov     rdi, r15
        mov     r8d, r13d
        mov     r9, [rbp+FV_ST+16]
        call    matvec_f32              ; att = K_g (n_t,hd) @ q_h; keeps ecx
        mov     r8d, ecx                ; hd
        mov     rdi, r15
        mov     esi, r13d
        movss   xmm0, [rbx+OP_A]
        movss   xmm1, [rbx+OP_C]
        call    softcap                 ; att = cap(att a); keeps rdi rsi r8
        call    softmax                 ; att = softmax(att); keeps rdi rsi r8
        pop     rax
        pop     rdx
        add     rdx, [rbp+FV_P+24]      ; V_g
        mov     ecx, esi
        mov     rsi, rdi
        mov     rdi, [rbp+FV_P]
        lea     rdi, [rdi+rax*4]        ; o_h
        call    matvec_t_f32            ; o_h = V_g^T (hd,n_t) @ att (r9: kept since K's)
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
        mov     ebp, fwd_vars
        mov     rbx, [rbp+FV_MODEL_BASE]        ; (model_base: a disp8 from fwd_vars)
        jmp     r11
