; sample.asm: choosing the next token. --temp 0: the first largest logit (numpy's argmax).
; Otherwise weights w_i = e^((l_i - max) / T) (unnormalised, the largest is 1), the nucleus
; = the tokens with w_i >= tau for the largest tau whose nucleus still holds top_p of the
; total weight (the smallest set of most probable tokens reaching top_p; ties at its edge
; all in), and a draw from it with probability proportional to w_i. tau is found by
; bisection on its float bits (non-negative floats order like their bits): no sort.
; Random numbers: the 64-bit LCG of Knuth's MMIX (a = 6364136223846793005, c = 1), its top
; 24 bits per draw; the state starts as the -s seed (default 0).

; walk: add up the weights >= tau in id order until the sum reaches the limit.
;   in: rdi weights [vocab], rbx header, xmm1 tau, xmm2 limit (NaN: never reached)
;   out: xmm0 sum, ecx = the id whose weight made the sum reach the limit (vocab if none; NaN
;   weights never count)   clobbers: xmm4
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
        cmp     ecx, [rbx+HDR_VOCAB]
        jb      .next
.reached:
        ret

; sample: the next token from the logits.
;   in: rdi logits [vocab] (overwritten with the weights when T > 0), rbx header,
;   rbp front_base   out: eax id < vocab   clobbers: rcx rdx rsi xmm0-xmm4 (x87 empty)
sample:
        xor     eax, eax
        xor     ecx, ecx
        movss   xmm0, [rdi]
.argmax:
        movss   xmm1, [rdi+rcx*4]
        ucomiss xmm1, xmm0
        jbe     .not_larger
        movaps  xmm0, xmm1
        mov     eax, ecx
.not_larger:
        inc     ecx
        cmp     ecx, [rbx+HDR_VOCAB]
        jb      .argmax
        cmp     dword [rbp+V_TEMP], 0
        je      walk.reached            ; T = 0: the argmax
        push    rax                     ; the argmax, kept for logits without a nucleus (NaN)
        mov     ecx, [rbx+HDR_VOCAB]
        fld     dword [rbp+V_TEMP]
        fld     dword [rdi+rax*4]       ; st0 = max, st1 = T
.weight:                                ; (from the last id down: each weight on its own)
        fld     dword [rdi+rcx*4-4]
        fsub    st0, st1
        fdiv    st0, st2
        call    exp_x87
        fstp    dword [rdi+rcx*4-4]
        loop    .weight
        fcompp                          ; pop max and T
        pcmpeqd xmm2, xmm2              ; NaN: walk the whole vocabulary
        xorps   xmm1, xmm1
        call    walk                    ; xmm0 = total weight
        mulss   xmm0, [rbp+V_TOP_P]
        movaps  xmm3, xmm0              ; the nucleus must hold this much
        xor     esi, esi                ; tau bits: lo (always enough), hi (never enough)
        mov     edx, 0x40000000         ; 2.0: above 1.0, the largest weight
.bisect:
        lea     eax, [rsi+rdx]
        shr     eax, 1
        movd    xmm1, eax
        call    walk
        cmp     eax, esi
        je      .draw                   ; tau = lo: xmm0 = the nucleus' weight
        ucomiss xmm0, xmm3
        cmovae  esi, eax
        cmovb   edx, eax
        jmp     .bisect
.draw:
        mov     rax, 6364136223846793005
        mul     qword [rbp+V_RNG]       ; (the low half, as imul's; rdx: free here)
        inc     rax
        mov     [rbp+V_RNG], rax
        shr     rax, 40                 ; 24 random bits
        cvtsi2ss xmm2, eax
        mulss   xmm2, [two_to_minus_24] ; u in [0, 1)
        mulss   xmm2, xmm0              ; u * nucleus weight <= the walk's final sum
        call    walk
        pop     rax
        cmp     ecx, [rbx+HDR_VOCAB]
        cmovb   eax, ecx                ; (none reached: the argmax)
        ret

two_to_minus_24:
        dd      0x33800000              ; 2^-24
