; main.asm: process start-up, the command line and the generation loop.

; Option kinds (opt_table): a flag takes no value; the others take the next argument.
K_FLAG  = 0                     ; sets the slot's low byte to 1
K_STR   = 1                     ; stores the argument's address
K_INT   = 2                     ; decimal integer (u64), stored as a qword
K_FLOAT = 3                     ; decimal float, stored as float32 bits
K_MIN1  = 4                     ; added to K_INT/K_FLOAT: the value (or its bits) must be >= 1

SIGPIPE_BIT = 1 shl 12          ; signal 13 in a sigset
DEFAULT_CTX = 4096

; start: the ELF entry point. The kernel leaves argc at [rsp], argv after it.
;   in: rsp -> argc, argv[], 0, envp[]   out: never returns
start:
        mov     rbx, rsp
        ; writes to a closed pipe must return EPIPE (then output.asm exits quietly)
        ; rather than kill the process: block SIGPIPE.
        push    SIGPIPE_BIT
        mov     rsi, rsp
        xor     edi, edi                ; SIG_BLOCK
        xor     edx, edx
        push    8                       ; sizeof(sigset_t) as the kernel counts it
        pop     rcx
        call    sys_sigprocmask
        pop     rax
        cmp     dword [rbx], 2
        jb      usage
        add     rbx, 16                 ; argv[1]
        mov     dword [opt_n], -1
        mov     dword [opt_top_p], 0x3F800000   ; 1.0
        mov     byte [n_threads], 1

; The command line: each argument must be a flag of opt_table; rbp = the flag (the argument
; of every error message here), rbx -> the next argv slot.
.next_arg:
        mov     rbp, [rbx]
        test    rbp, rbp
        jz      .args_done
        add     rbx, 8
        lea     rdi, [opt_table]
.find:
        mov     rdx, rdi                ; this entry's name
        xor     eax, eax
        or      rcx, -1
        repne   scasb                   ; rdi -> its kind byte
        xor     ecx, ecx
.compare:
        mov     al, [rdx+rcx]
        cmp     al, [rbp+rcx]
        jne     .other
        inc     ecx
        test    al, al
        jnz     .compare
        movzx   eax, byte [rdi]         ; kind
        movzx   ecx, byte [rdi+1]       ; slot offset
        lea     r12, [options+rcx]
        test    eax, eax
        jnz     .value
        inc     byte [r12]              ; K_FLAG
        jmp     .next_arg
.other:
        add     rdi, 6
        cmp     byte [rdi], 0
        jne     .find
        lea     rsi, [msg_unknown]
        jmp     fatal_arg
.value:
        mov     rsi, [rbx]
        test    rsi, rsi
        jz      err_missing_value
        add     rbx, 8
        cmp     al, K_STR
        je      .store
        mov     r13d, eax
        shr     r13d, 2                 ; minimum: 0 or 1
        test    al, 1
        jz      .int
        call    parse_float
        jmp     .range
.int:
        call    parse_uint
.range:
        cmp     byte [rsi], 0           ; trailing characters
        jne     err_bad_value
        sub     rax, r13
        movsxd  rcx, dword [rdi+2]      ; maximum - minimum (0xFFFFFFFF: any u64)
        cmp     rax, rcx
        ja      err_bad_value
        add     rax, r13
        xchg    rsi, rax
.store:
        mov     [r12], rsi
        jmp     .next_arg
.args_done:
        cmp     qword [opt_model], 0
        lea     rsi, [msg_no_model]
        je      fatal

        call    load_model              ; validates everything the file holds
        mov     rax, [model_base]
        mov     ecx, [rax+HDR_MAX_CTX]
        mov     eax, [opt_ctx]
        lea     rbp, [opt_name_c]
        test    eax, eax
        jnz     .ctx_given
        mov     eax, DEFAULT_CTX
        cmp     eax, ecx
        cmova   eax, ecx
.ctx_given:
        cmp     eax, ecx
        ja      err_bad_value
        mov     [ctx_len], eax
        mov     ecx, [opt_n]            ; -n <= context (0xFFFFFFFF: not given)
        cmp     ecx, eax
        jbe     .n_ok
        lea     rbp, [opt_name_n]
        inc     ecx
        jnz     err_bad_value
.n_ok:
        call    model_setup
        call    tokenize                ; r12 -> ids, r13d = count
        cmp     r13d, [ctx_len]
        lea     rsi, [msg_long_prompt]
        ja      fatal
        cmp     byte [opt_tokens], 0
        jne     print_ids

        mov     rdi, [opt_logits]
        test    rdi, rdi
        jz      .no_logits
        mov     rbp, rdi
        mov     esi, 0x241              ; O_WRONLY | O_CREAT | O_TRUNC
        mov     edx, 420                ; 0644
        call    sys_open
        test    eax, eax
        lea     rsi, [msg_cannot_write]
        js      fatal_arg
        mov     [logits_fd], eax
.no_logits:
        mov     rax, [opt_seed]
        mov     rcx, 0x9E3779B97F4A7C15 ; xorshift64* needs a state other than 0
        xor     rax, rcx
        cmovz   rax, rcx
        mov     [rng_state], rax

; The generation loop: feed the prompt's ids, then sample, print and feed each new id.
; ebx = id to evaluate, ebp = position, r12 -> prompt ids, r13d = prompt length,
; r14d = ids generated, r15 = logits.
        mov     ebx, [r12]              ; BOS
        xor     ebp, ebp
        xor     r14d, r14d
.step:
        mov     eax, ebx
        mov     ecx, ebp
        call    forward
        mov     r15, rax
        mov     edi, [logits_fd]
        test    edi, edi
        jz      .logits_done
        mov     rsi, rax
        mov     rax, [model_base]
        mov     edx, [rax+HDR_VOCAB]
        shl     rdx, 2
        call    write_all
.logits_done:
        inc     ebp
        cmp     ebp, r13d
        jae     .generate
        mov     ebx, [r12+rbp*4]
        jmp     .step
.generate:
        cmp     r14d, [opt_n]
        je      exit_ok
        mov     rdi, r15
        call    sample
        mov     ebx, eax
        mov     rax, [model_base]
        cmp     ebx, [rax+HDR_EOS]
        je      exit_ok
        cmp     ebx, [rax+HDR_EOT]
        je      exit_ok
        mov     eax, ebx
        call    put_piece
        inc     r14d
        cmp     r14d, [opt_n]
        je      exit_ok
        cmp     ebp, [ctx_len]
        jb      .step
exit_ok:
        call    flush
        xor     edi, edi
        jmp     sys_exit

err_missing_value:
        lea     rsi, [msg_missing]
        jmp     fatal_arg
err_bad_value:
        lea     rsi, [msg_bad_value]
        jmp     fatal_arg

; parse_uint: a decimal u64.
;   in: rsi string   out: rax value, rsi -> the first byte after the digits
;   (err_bad_value when there is no digit or the value overflows)   clobbers: rcx rdx r10 r11
parse_uint:
        xor     eax, eax
        call    parse_digits
        jrcxz   err_bad_value
        ret

; parse_digits: more decimal digits appended to rax (rax = rax * 10 + digit for each).
;   in: rsi string, rax   out: rax, ecx digits read, rsi -> after them
;   (err_bad_value when rax overflows 64 bits)   clobbers: rdx r10 r11
parse_digits:
        xor     ecx, ecx
        push    10
        pop     r11
.digit:
        movzx   r10d, byte [rsi+rcx]
        sub     r10d, '0'
        cmp     r10d, 9
        ja      .end
        mul     r11
        jc      err_bad_value
        add     rax, r10
        jc      err_bad_value
        inc     ecx
        jmp     .digit
.end:
        add     rsi, rcx
        ret

; parse_float: a decimal number: digits, optionally '.' and digits (at least one digit in
; all, at most 2^63 - 1 as an integer), optionally e or E, a sign and digits (<= 1000).
; The digits are an exact integer, scaled by powers of ten in double, rounded to float32.
;   in: rsi string   out: rax float32 bits (0x7F800000 when it overflows), rsi -> after it
;   (err_bad_value when malformed)   clobbers: rcx rdx r8-r11 xmm0 xmm1
parse_float:
        xor     eax, eax
        call    parse_digits
        mov     r9d, ecx                ; digits
        xor     r8d, r8d                ; decimal exponent
        cmp     byte [rsi], '.'
        jne     .mantissa_done
        inc     rsi
        call    parse_digits
        add     r9d, ecx
        sub     r8d, ecx
.mantissa_done:
        test    r9d, r9d
        jz      err_bad_value
        test    rax, rax
        js      err_bad_value           ; cvtsi2sd reads it signed
        cvtsi2sd xmm0, rax
        movsd   xmm1, [float_ten]
        mov     al, [rsi]
        or      al, 0x20
        cmp     al, 'e'
        jne     .scale
        inc     rsi
        mov     r9b, [rsi]
        cmp     r9b, '-'
        je      .exp_sign
        cmp     r9b, '+'
        jne     .exp_digits
.exp_sign:
        inc     rsi
.exp_digits:
        call    parse_uint
        cmp     rax, 1000               ; beyond float32 either way
        ja      err_bad_value
        cmp     r9b, '-'
        jne     .exp_add
        neg     eax
.exp_add:
        add     r8d, eax
.scale:
        test    r8d, r8d
        jz      .round
        js      .down
        mulsd   xmm0, xmm1
        dec     r8d
        jmp     .scale
.down:
        divsd   xmm0, xmm1
        inc     r8d
        jmp     .scale
.round:
        cvtsd2ss xmm0, xmm0
        movd    eax, xmm0
        ret

float_ten:
        dq      10.0

; The options: name, 0, kind, slot (offset from `options`, vars.asm), maximum - minimum of
; the value as a dword (sign-extended: 0xFFFFFFFF allows any u64). Ends with a 0 byte.
opt_table:
        db      '-m', 0, K_STR, opt_model - options
        dd      0
        db      '-p', 0, K_STR, opt_prompt - options
        dd      0
opt_name_n:
        db      '-n', 0, K_INT, opt_n - options
        dd      0x7FFFFFFF              ; further checked against the context
        db      '--temp', 0, K_FLOAT, opt_temp - options
        dd      0x7F7FFFFF              ; finite, >= 0 (no sign accepted)
        db      '--top-p', 0, K_FLOAT + K_MIN1, opt_top_p - options
        dd      0x3F800000 - 1          ; (0, 1]
        db      '-s', 0, K_INT, opt_seed - options
        dd      0xFFFFFFFF
        db      '-t', 0, K_INT + K_MIN1, n_threads - options
        dd      256 - 1                 ; 1..256
opt_name_c:
        db      '-c', 0, K_INT + K_MIN1, opt_ctx - options
        dd      0x7FFFFFFF - 1          ; further checked against the model's max_ctx
        db      '--tokens', 0, K_FLAG, opt_tokens - options
        dd      0
        db      '--logits', 0, K_STR, opt_logits - options
        dd      0
        db      0

