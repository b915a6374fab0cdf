; program.asm: the model file's program (docs/format.md, "Version 4"): what each opcode's
; operands are (op_table), check_program's validation of the slots and of every op before
; anything runs, and model_setup, which gives every slot its buffer. forward.asm runs it.

; op_table: 8 bytes per opcode (OPC_EMBED first): the width codes of the slot operands s0 ..
; s3 (OPW_*, 0: the op has no such operand), the kind of its weight (WK_*, 0: none), OPT_*,
; and its handler's address minus h_embed's (a word: below 256).
OPW_N           = 1             ; a row of n floats
OPW_M           = 2             ; m
OPW_NM          = 3             ; n m
OPW_NK          = 4             ; n k (op_width reads OP_N, OP_M, OP_K by these values: the
                                ; fields follow each other in the record)
OPW_OPTIONAL    = 8             ; + slot 0 (none) allowed
OPW_KV          = 16            ; + a CACHE slot that an earlier op wrote (its s0)
OPW_EMPTY       = 32            ; + the row may be empty (then the op does not touch it)
OPW_ALIGN4      = 64            ; + a multiple of 4 floats (GEGLU's four values a pass)
OPW_APART       = 128           ; + a slot no operand before it names (MATMUL's and ATTN's
                                ; operands: they read a slot while they write another, on
                                ; several threads)
WK_VEC          = 1             ; [n] F32
WK_HALF         = 2             ; [n/2] F32 (n even)
WK_MAT          = 3             ; [m, n] F16 or Q8_0
WK_TABLE        = 4             ; [vocab, k] F16 or Q8_0
WK_OUT          = 5             ; [vocab, n] F16 or Q8_0
OPT_TOKEN       = 1             ; the handler runs once per token (else once per block)
SLOT_WRITTEN    = 2             ; slot_cache: an earlier op wrote the slot (check_program;
                                ; the file's flags are SLOT_CACHE at most)

op_table:
        db      OPW_N, 0, 0, 0, WK_TABLE, OPT_TOKEN                     ; EMBED
        dw      h_embed - h_embed
        db      OPW_NM, OPW_NM, 0, 0, WK_VEC, 0                         ; NORM
        dw      h_norm - h_embed
        db      OPW_M, OPW_N+OPW_APART, OPW_M+OPW_OPTIONAL+OPW_ALIGN4+OPW_APART, 0, WK_MAT, 0   ; MATMUL
        dw      h_matmul - h_embed
        db      OPW_NM, OPW_NK+OPW_EMPTY, 0, 0, WK_HALF, OPT_TOKEN      ; ROPE
        dw      h_rope - h_embed
        db      OPW_NM, OPW_NM+OPW_APART, OPW_NK+OPW_KV+OPW_APART, OPW_NK+OPW_KV+OPW_APART, 0, 0        ; ATTN
        dw      h_attn - h_embed
        db      OPW_N+OPW_ALIGN4, OPW_N, 0, 0, 0, 0                     ; GEGLU
        dw      h_geglu - h_embed
        db      OPW_N, 0, 0, 0, 0, 0                                    ; SCALE
        dw      h_scale - h_embed
        db      OPW_N, OPW_N, 0, 0, 0, 0                                ; ADD
        dw      h_add - h_embed
        db      0, OPW_N, 0, 0, WK_OUT, 0                               ; LOGITS
        dw      h_logits - h_embed

; op_width: operand r15 of the op: its width code (op_table) and the floats of its row, from
; the code and the op's n, m, k.
;   in: r13 the op, r14 its op_table row, r15 the operand - 4 (-4 .. -1: s0 .. s3)
;   out: eax the code (OPW_* and flags), rdx the floats (0 for code 0), ZF set for code 0
;   (no such operand)   clobbers: rcx
op_width:
        movzx   eax, byte [r14+r15+4]
        xor     edx, edx
        mov     ecx, eax
        and     ecx, 7
        jz      .ret
        cmp     cl, OPW_NM
        jae     .product
        mov     edx, [r13+OP_N-4+rcx*4] ; OPW_N: n, OPW_M: m (ZF clear)
        ret
.product:
        mov     edx, [r13+OP_N]
        mov     ecx, [r13+OP_M-4*OPW_NM+rcx*4]  ; OPW_NM: m, OPW_NK: k (OP_M + 4 = OP_K)
        imul    rdx, rcx                ; (n, m, k < 2^32: exact)
        test    eax, eax                ; (ZF clear)
.ret:
        ret

; weight_row: the bytes of a row of ecx weights of the op's type (WT_*: F32 4 each, F16 2, Q8_0
; Q8_0_BLOCK per QK8_0), the kernel record of products with such rows (cpu.asm's choice
; for the type) and the routine that looks up one (an embedding row: matmul_f16 of the row
; as a (cols,1) column by [s], or dequant_q8).
;   in: r13 the op (its type F32, F16 or Q8_0: validated), ecx cols (< 2^25; Q8_0: a
;   multiple of QK8_0)   out: r10 bytes, r11 kernel record, rax lookup   clobbers: -
weight_row:
        mov     eax, [r13+OP_WTYPE]
        imul    r10d, ecx, 4
        cmp     al, WT_F16
        jb      .ret                    ; F32
        lea     r10d, [rcx+rcx]
        mov     r11d, job_kernel        ; (addresses are below 2^32)
        mov     eax, matmul_f16
        je      .ret                    ; F16
        imul    r10d, ecx, Q8_0_BLOCK / 2
        shr     r10d, 4                 ; cols * 17 / 16 (exact: a multiple of 32)
        mov     r11d, job_kernel_q8
        mov     eax, dequant_q8
.ret:
        ret

; check_program: validate the slots and the program (docs/format.md, "Version 4"): every
; slot's width 1 .. MAX_WIDTH and flags known (copied to slot_cache); every op: opcode known;
; each slot operand 1 .. n_slots (0 only where optional), its row (op_width: n, m and k
; below 2^32, so the products are exact) within the slot's width, not empty (but ROPE's s1),
; a multiple of 4 floats where GEGLU runs on it (a MATMUL's gate s2, GEGLU's s0), a slot of
; its own where the op reads one slot while it writes another (MATMUL's and ATTN's operands);
; ATTN's K and V CACHE slots that an earlier op wrote; the weight inside the weights region, at a
; multiple of TENSOR_ALIGN, of a type its kind allows (Q8_0 only on rows of a multiple of
; QK8_0; ROPE's n even); EMBED's columns j + n <= k <= MAX_WIDTH (Q8_0: j, n multiples of
; QK8_0); ATTN's k dividing m; LOGITS the last op, and only there. After it, no op reaches
; outside its buffers. It also ors every MATMUL's and LOGITS' n into fv_cols (cpu.asm).
;   in: rbx header, rbp front_base   out: slot_cache, fv_cols   (fatal
;   "bad program")
;   clobbers: rax rcx rdx rsi rdi r8-r15
check_program:
        mov     rsi, [rbp+V_SLOTS]
        mov     r9, rsi
        mov     ecx, [rbx+HDR_N_SLOTS]
        mov     edi, slot_cache+1       ; (addresses are below 2^32)
.slot:
        lodsd                           ; width
        dec     eax
        shr     eax, 16
        jnz     .bad
        lodsd                           ; flags
        cmp     eax, SLOT_CACHE
        ja      .bad
        stosb
        loop    .slot
        mov     r13, rsi                ; the program (program_off = slots_off + 8 n_slots)
        mov     r12d, [rbx+HDR_N_OPS]
.op:
        mov     eax, [r13+OP_OP]
        lea     r14, [op_table-8+rax*8] ; (as forward finds it)
        dec     eax
        cmp     eax, N_OPCODES-1
        ja      .bad
        push    -4
        pop     r15
.operand:                               ; s0 .. s3 (r15 = -4 .. -1)
        call    op_width
        jz      .next                   ; no such operand
        movzx   ecx, byte [r13+OP_S0+4+r15]
        jrcxz   .none
        cmp     ecx, [rbx+HDR_N_SLOTS]
        ja      .bad
        mov     esi, [r9+rcx*8-SLOT_REC+SLOT_WIDTH]
        cmp     rdx, rsi
        ja      .bad
        test    al, OPW_EMPTY
        jnz     .kv
        test    edx, edx                ; (rdx <= the width, below 2^32: just checked)
        jz      .bad
        test    al, OPW_ALIGN4
        jz      .kv
        test    dl, 3
        jnz     .bad
.kv:
        test    al, OPW_APART
        jz      .cache
        lea     edi, [r15+4]            ; the operands before it: other slots
.apart:
        cmp     cl, [r13+OP_S0-1+rdi]
        je      .bad
        dec     edi
        jnz     .apart
.cache:
        test    al, OPW_KV
        jz      .next
        cmp     byte [slot_cache+rcx], SLOT_CACHE+SLOT_WRITTEN
        je      .next                   ; a cache an earlier op wrote
.bad:
        call    fatal_here
        db      'bad program', 0
.none:
        test    al, OPW_OPTIONAL
        jz      .bad
.next:
        inc     r15
        jnz     .operand
        movzx   ecx, byte [r13+OP_S0]
        or      byte [slot_cache+rcx], SLOT_WRITTEN

        mov     al, [r13+OP_OP]         ; what the handlers assume (EMBED's: with its table)
        cmp     al, OPC_ATTN
        jne     .logits
        mov     eax, [r13+OP_M]
        cdq                             ; (m <= n m <= MAX_WIDTH)
        div     dword [r13+OP_K]        ; (k >= 1: K's row is not empty)
        test    edx, edx
        jmp     .test
.logits:
        cmp     al, OPC_LOGITS
        jne     .weight
        dec     r12d                    ; the last op (r12d = 1; 0 now: .ok's dec makes
.test:                                  ; it negative, which ends the loop)
        jne     .bad

.weight:
        mov     al, [r14+4]             ; the weight's kind
        mov     edx, [r13+OP_WTYPE]
        mov     ecx, [r13+OP_N]
        push    1
        pop     r8                      ; rows
        cmp     al, WK_HALF
        ja      .matrix
        jb      .vector
        shr     ecx, 1                  ; [n/2]
        jc      .bad                    ; (n odd)
.vector:
        test    al, al                  ; (kind 0: no weight, nothing to check; here the
        jz      .ok                     ; jump is a short one)
        test    edx, edx                ; F32
        jz      .room
.bad2:
        jmp     .bad                    ; (the rest of the routine reaches it in a short jump)
.matrix:
        mov     r8d, [rbx+HDR_VOCAB]
        cmp     al, WK_TABLE
        je      .table
        ja      .cols                   ; [vocab, n]
        mov     r8d, [r13+OP_M]         ; [m, n]
.cols:
        or      [rbp+V_COLS], ecx       ; (a product's n: the kernels' choice)
        jmp     .typed
.table:                                 ; EMBED: columns j .. j+n-1 of k (ecx = n)
        mov     r15d, [r13+OP_J]
        lea     rsi, [r15+rcx]          ; j + n (64 bits: no wrap)
        or      r15d, ecx               ; j | n: whole Q8_0 blocks, with k (.typed)
        mov     ecx, [r13+OP_K]         ; [vocab, k]
        cmp     rsi, rcx
        ja      .bad2                   ; j + n <= k
        cmp     ecx, MAX_WIDTH
        ja      .bad2
.typed:
        dec     edx
        cmp     edx, WT_Q8_0-1
        ja      .bad2                   ; neither F16 nor Q8_0
        jb      .room
        or      r15d, ecx               ; (r15 = 0 but after .table: the operands' loop
        test    r15b, QK8_0-1           ; ends there)
        jnz     .bad2
.room:
        call    weight_row
        imul    r10, r8
        mov     rax, [r13+OP_W]
        test    al, TENSOR_ALIGN-1
        jnz     .bad2
        add     rax, r10
        jc      .bad2
        cmp     rax, [rbx+HDR_WEIGHTS_SIZE]
        ja      .bad2

.ok:
        add     r13, OP_REC
        dec     r12d
        jg      .op
        jz      .bad2                   ; the last op is not LOGITS (0, not -1)
        ret

; model_setup: validate the program (check_program), then give each slot its buffer: a
; CACHE slot ctx_len rows of its width, any other BLOCK rows; the attention's rows (BLOCK
; threads at most, ctx_len + MATVEC_LANES - 1 floats each: softmax's lanes past n_t) and the
; logits' (BLOCK, vocab); choose the kernels (cpu_setup) and start the workers
; (threads_start).
;   in: rbx model header, rbp front_base, ctx_len, n_threads   out: slot_ptr, fv_att,
;   fv_logits; fatal "bad program", "out of memory"
;   clobbers: rax rcx rdx rsi rdi r8-r15 xmm0 (keeps rbx rbp)
model_setup:
        push    rbp                     ; (also aligns rsp for the calls)
        call    check_program
        mov     r12d, [rbx+HDR_N_SLOTS]
.buffer:
        mov     rax, [rbp+V_SLOTS]
        mov     edi, [rax+r12*8-SLOT_REC+SLOT_WIDTH]
        shl     edi, 2                  ; a row's bytes (<= 2^18)
        test    byte [slot_cache+r12], SLOT_CACHE
        push    BLOCK
        pop     rax
        cmovnz  eax, [rbp+V_CTX_LEN]
        imul    rdi, rax
        call    alloc
        mov     [slot_ptr+r12*8], rax
        dec     r12d
        jnz     .buffer
        mov     edi, [rbp+V_CTX_LEN]
        add     edi, MATVEC_LANES-1
        shl     rdi, 2+BLOCK_SHIFT
        call    alloc
        mov     [fv_att], rax
        mov     edi, [rbx+HDR_VOCAB]
        shl     rdi, 2+BLOCK_SHIFT
        call    alloc
        mov     [fv_logits], rax
        call    cpu_setup               ; the kernel (cpu.asm; keeps rbx)
        call    threads_start           ; the workers (threads.asm; keeps rbx)
        pop     rbp
        ret
