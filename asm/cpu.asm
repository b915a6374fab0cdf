; cpu.asm: the instruction-set level, chosen once at start-up.

CPUID1_NEED = (1 shl 12) or (1 shl 27) or (1 shl 28) or (1 shl 29) ; ecx: FMA OSXSAVE AVX F16C
XCR0_SSE_AVX = 6                                        ; the OS saves XMM and YMM state
CPUID7_AVX512F = 16                                     ; leaf 7 ebx: its bit
XCR0_AVX512 = 0xE0                                      ; ... and opmask, ZMM0-15 high, ZMM16-31

; cpu_setup: the matrix-product kernel every thread calls and the tokens it takes per call
; (a kernel record per weight type, vars.asm): matmul_f16_avx2 and 3 (its prompt tiles; the
; Q8_0 kernel 4) when CPUID leaf 1 reports AVX, FMA, F16C and OSXSAVE, XGETBV shows
; XCR0 bits 1 and 2 (all that kernel uses) and every product's n (the columns of its
; weights, fv_cols: check_program) is a multiple of 16 (its precondition; every Gemma's is), unless --baseline was given;
; matmul_f16_avx512 instead where CPUID leaf 7 reports AVX-512F and XCR0 has bits 5-7 too,
; unless --avx2 was given (8 tokens: its 3 x 8 tiles, both types); matmul_f16 and 1 otherwise. Q8_0 matrices:
; matmul_q8_avx2, matmul_q8_avx512 and matmul_q8 likewise.
;   in: opt_baseline, opt_avx2 (rbp front_base), fv_cols, rbx the model header
;   out: job_kernel, job_tokens, job_kernel_q8, job_tokens_q8
;   clobbers: rax rcx rdx rsi rdi r8
cpu_setup:
        push    rbx
        mov     esi, matmul_f16     ; (addresses are below 2^32)
        mov     r8d, matmul_q8
        push    1
        pop     rdi
        cmp     byte [rbp+V_BASELINE], 0
        jne     .chosen
        test    byte [rbp+V_COLS], 15
        jnz     .chosen                 ; a product's n (dim, ffn, heads x head_dim) is not
                                        ; a multiple of 16
        mov     eax, edi                ; leaf 1
        cpuid
        not     ecx
        and     ecx, CPUID1_NEED        ; (so ecx = 0 below: XGETBV's XCR0, CPUID's
        jnz     .chosen                 ; subleaf 0)
        xgetbv                          ; XCR0 (allowed: OSXSAVE is set)
        not     eax
        test    al, XCR0_SSE_AVX
        jnz     .chosen
        mov     esi, matmul_f16_avx2
        mov     r8d, matmul_q8_avx2
        mov     dil, FAST_TOKENS
        cmp     byte [rbp+V_AVX2], 0
        jne     .chosen
        test    al, XCR0_AVX512         ; (eax = not XCR0)
        jnz     .chosen
        push    7
        pop     rax
        cpuid
        bt      ebx, CPUID7_AVX512F
        jnc     .chosen
        mov     esi, matmul_f16_avx512
        mov     r8d, matmul_q8_avx512
        add     edi, edi                ; TILE8_TOKENS (fast512.asm)
.chosen:
        mov     ebx, job_vars
        mov     [rbx+job_kernel-job_vars], rsi
        mov     [rbx+job_kernel_q8-job_vars], r8
        mov     [rbx+job_tokens_q8-job_vars], edi
        cmp     edi, FAST_TOKENS        ; (the AVX2 kernels' tokens, theirs alone)
        jne     .tokens
        dec     edi                     ; AVX2 FP16: TILE_TOKENS, its prompt tiles (fast.asm)
.tokens:
        mov     [rbx+job_tokens-job_vars], edi
        pop     rbx
        ret
