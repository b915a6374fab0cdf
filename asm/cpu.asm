; cpu.asm: the instruction-set level, chosen once at start-up.

CPUID1_NEED = (1 shl 27) or (1 shl 28) or (1 shl 29)   ; ecx: OSXSAVE, AVX, F16C
XCR0_SSE_AVX = 6                                        ; the OS saves XMM and YMM state

; cpu_setup: the matrix-product kernel every thread calls: matmul_f16_avx2 when CPUID leaf 1
; reports AVX, F16C and OSXSAVE and XGETBV shows XCR0 bits 1 and 2 (all that kernel uses),
; unless --baseline was given; matmul_f16 otherwise.
;   in: --baseline (byte 1 of opt_tokens)   out: job_kernel   clobbers: rax rcx rdx rsi
cpu_setup:
        push    rbx
        lea     rsi, [matmul_f16]
        cmp     byte [opt_tokens+1], 0  ; --baseline (main.asm)
        jne     .chosen
        push    1
        pop     rax
        cpuid
        not     ecx
        test    ecx, CPUID1_NEED
        jnz     .chosen
        xor     ecx, ecx
        xgetbv                          ; XCR0 (allowed: OSXSAVE is set)
        not     eax
        test    al, XCR0_SSE_AVX
        jnz     .chosen
        lea     rsi, [matmul_f16_avx2]
.chosen:
        mov     [job_kernel], rsi
        pop     rbx
        ret
