; sample.asm: choosing the next token. --temp 0: the first largest logit (numpy's argmax).
; Otherwise weights w_i = e^((l_i - max) / T) (unnormalised, the largest is 1), the nucleus
; = the tokens with w_i >= tau for the largest tau whose nucleus still holds top_p of the
; total weight (the smallest set of most probable tokens reaching top_p; ties at its edge
; all in), and a draw from it with probability proportional to w_i. tau is found by
; bisection on its float bits (non-negative floats order like their bits): no sort.
; Random numbers: xorshift64* (Marsaglia, Vigna), seeded from -s in main.asm.

; sample: the next token from the logits.
;   in: rdi logits [vocab] (overwritten with the weights when T > 0)   out: eax id < vocab
;   clobbers: rcx rdx rsi r8-r11 xmm0-xmm4 (x87 left empty)
sample:
        mov     rax, [model_base]
        mov     r8d, [rax+HDR_VOCAB]
        xor     ecx, ecx
        xor     eax, eax
        movss   xmm0, [rdi]
.argmax:
        movss   xmm1, [rdi+rcx*4]
        ucomiss xmm1, xmm0
        jbe     .not_larger
        movaps  xmm0, xmm1
        mov     eax, ecx
.not_larger:
        inc     ecx
        cmp     ecx, r8d
        jb      .argmax
        cmp     dword [opt_temp], 0
        je      .done
        push    rax                     ; the argmax, kept for logits without a nucleus (NaN)
        fld     dword [opt_temp]
        fld     dword [rdi+rax*4]       ; st0 = max, st1 = T
        xor     ecx, ecx
.weight:
        fld     dword [rdi+rcx*4]
        fsub    st0, st1
        fdiv    st0, st2
        call    exp_x87
        fstp    dword [rdi+rcx*4]
        inc     ecx
        cmp     ecx, r8d
        jb      .weight
        fcompp                          ; pop max and T
        mov     eax, 0x7F800000         ; +inf: walk the whole vocabulary
        movd    xmm2, eax
        xorps   xmm1, xmm1
        call    walk                    ; xmm0 = total weight
        movss   xmm3, xmm0
        mulss   xmm3, [opt_top_p]       ; the nucleus must hold this much
        xor     r10d, r10d              ; tau bits: lo (always enough), hi (never enough)
        mov     r11d, 0x3F800001        ; just above 1.0, the largest weight
.bisect:
        lea     eax, [r10+r11]
        shr     eax, 1
        cmp     eax, r10d
        je      .draw
        movd    xmm1, eax
        call    walk
        ucomiss xmm0, xmm3
        jb      .too_little
        mov     r10d, eax
        jmp     .bisect
.too_little:
        mov     r11d, eax
        jmp     .bisect
.draw:
        movd    xmm1, r10d
        call    walk                    ; xmm0 = the nucleus' weight
        mov     rax, [rng_state]        ; xorshift64*
        mov     rdx, rax
        shr     rdx, 12
        xor     rax, rdx
        mov     rdx, rax
        shl     rdx, 25
        xor     rax, rdx
        mov     rdx, rax
        shr     rdx, 27
        xor     rax, rdx
        mov     [rng_state], rax
        mov     rdx, 0x2545F4914F6CDD1D
        imul    rax, rdx
        shr     rax, 40                 ; 24 random bits
        cvtsi2ss xmm2, eax
        mulss   xmm2, [two_to_minus_24] ; u in [0, 1)
        mulss   xmm2, xmm0              ; u * nucleus weight <= the walk's final sum
        call    walk
        pop     rax
        cmp     ecx, r8d
        jae     .done
        xchg    eax, ecx
.done:
        ret

; walk: add up the weights >= tau in id order until the sum reaches the limit.
;   in: rdi weights, r8d count, xmm1 tau, xmm2 limit   out: xmm0 sum, ecx = the id whose
;   weight made the sum reach the limit (r8d if none; NaN weights never count)
;   clobbers: xmm4
walk:
        xorps   xmm0, xmm0
        xor     ecx, ecx
.next:
        movss   xmm4, [rdi+rcx*4]
        ucomiss xmm4, xmm1
        jb      .skip                   ; below tau, or NaN
        addss   xmm0, xmm4
        ucomiss xmm0, xmm2
        jae     .reached
.skip:
        inc     ecx
        cmp     ecx, r8d
        jb      .next
.reached:
        ret

two_to_minus_24:
        dd      0x33800000              ; 2^-24
