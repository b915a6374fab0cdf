; main.asm: process start-up, the command line and the generation loop.

; Option kinds (opt_table): a flag takes no value; the others take the next argument.
K_STR   = 0                     ; stores the argument's address
K_FLAG  = 1                     ; sets the slot's byte to 1
K_INT   = 4                     ; decimal integer (u64), stored as a qword
K_FLOAT = 5                     ; decimal float, stored as float32 bits
K_MIN1  = 8                     ; added to K_INT/K_FLOAT: the value (or its bits) must be >= 1
                                ; (bit 2: the entry holds a maximum; bit 0: float)

SIGPIPE = 13
LOGITS_STAT = 16                ; out_buf offset of the --logits file's struct stat (144 bytes),
                                ; after the model's first 16 (load_model)
DEFAULT_CTX = 4096

; start: the ELF entry point. The kernel leaves argc at [rsp], argv after it.
;   in: rsp -> argc, argv[], 0, envp[] (every other register: anything)   out: never returns
start:
        mov     ebp, front_base         ; for good (vars.asm)
        ; writes to a closed pipe must return EPIPE (then output.asm exits quietly)
        ; rather than kill the process: block SIGPIPE. (No register but rsp is read before
        ; it is written: the packed program's stub leaves its decoder's values in them.)
        lea     esi, [rbp+V_SIGSET]     ; (rbp < 2^32)
        mov     byte [rsi+1], 1 shl (SIGPIPE - 9) ; (signal n: bit n - 1, in byte 1 here)
        xor     edi, edi                ; SIG_BLOCK
        xor     edx, edx                ; no old set
        lea     ecx, [rdi+8]            ; sizeof(sigset_t) as the kernel counts it
        mov     al, SYS_rt_sigprocmask  ; (its only call: no wrapper)
        call    sys_call
        mov     dword [rbp+V_PROMPT], empty_text ; no -p: the empty prompt
        pop     rcx                     ; argc
        dec     ecx
        jle     usage
        pop     rax                     ; argv[0]
        dec     dword [rbp+V_N]         ; 0xFFFFFFFF (from 0)
        fld1                            ; --top-p 1.0 (the x87 stack is empty)
        fstp    dword [rbp+V_TOP_P]
        pop     rbx                     ; argv[1] (argc >= 2)

; The command line, popped off the stack: each argument must be a flag of opt_table; rbx =
; the flag (the argument of every error message here), [rsp] = the next argv slot; next_arg
; (below) pops the next one.
parse_arg:
        xor     eax, eax
        mov     esi, opt_table
find_option:
        push    rbx
        pop     rdi
.compare:
        lodsb
        cmp     al, ' '
        jae     .char
        cmp     [rdi], ah               ; the name ended (al = kind): the argument too?
        jne     skip_entry.kind
        movsx   r12, byte [rsi]         ; the slot, from rbp
        cmp     al, K_FLAG
        je      option_value.flag
; option_value: parse the value of the option at opt_table entry and store it (at .flag: set a
; flag's byte); a jump target of the command line's loop, not a call.
;   in: eax kind, rsi -> the entry's slot byte, r12 slot (from rbp), [rsp] the value's argv
;   slot   out: [rbp+r12] value, the value popped; continues at next_arg
;   clobbers: rax rcx rdx rsi rdi r8 r11
option_value:
        push    rsi
        pop     rdi                     ; -> the entry's slot byte
        pop     rsi
        test    rsi, rsi
        jz      err_missing_value
        test    al, al                  ; K_STR
        jz      .store
        call    parse_value
        xchg    rsi, rax
.store:
        mov     [r12+rbp], rsi
        xchg    eax, esi                ; (its low byte, stored again)
.flag:                                  ; K_FLAG: al = 1
        mov     [r12+rbp], al
next_arg:
        pop     rbx
        test    rbx, rbx
        jnz     parse_arg
        jmp     setup

; The table walk's name bytes, its mismatch path and the command line's errors.
find_option.char:                       ; al = a byte of the name
        scasb
        je      find_option.compare
skip_entry:                             ; the rest of the name
        lodsb
        cmp     al, ' '
        jae     skip_entry
.kind:                                  ; al = kind, rsi -> slot
        and     al, K_INT
        lea     esi, [rsi+rax+1]        ; the next entry
        cmp     [rsi], ah
        jne     find_option
        cmp     byte [rbx], '-'         ; no option of the table: a flag, or a stray argument?
        jne     err_stray_argument
        call    fatal_usage_arg_here
        db      'unknown option ', 0
err_missing_value:
        call    fatal_usage_arg_here
        db      'no value for ', 0
err_stray_argument:
        call    fatal_usage_arg_here
        db      'unexpected argument ', 0

; help: -h / --help: print the usage text on stdout and exit with status 0 (sys.asm's usage
; code; here in short-jump reach of setup).
help:
        push    STDOUT
        jmp     usage.put

; setup: the usage checks, the prompt (-f), the model, the context, the prompt's ids; then
; the generation loop (next_arg goes on here once every argument is parsed).
;   in: rbp front_base with the options stored   out: never returns (exits)
setup:
        and     rsp, -16                ; (argv popped)
        cmp     byte [rbp+V_HELP], 0
        jne     help
        cmp     qword [rbp+V_MODEL], 0
        je      .err_no_model
        cmp     byte [rbp+V_CNV], 0
        je      .checked
        cmp     byte [rbp+V_TOKENS], 0
        jne     .err_cnv
        cmp     dword [rbp+V_N], 0
        jne     .checked
.err_cnv:                               ; (setup's usage errors: out of the way of the prompt's
        call    fatal_usage_here        ; jumps, in the short reach of the checks)
        db      '-cnv: no --tokens, -n 0 or -f -', 0
.err_prompt_and_file:
        call    fatal_usage_here
        db      'use -p or -f, not both', 0
.err_no_model:
        call    fatal_usage_here
        db      'no model (-m)', 0
.checked:

; The prompt: with -f FILE the file's bytes ("-": standard input's), one trailing newline
; dropped (as llama.cpp does), in fresh zeroed memory (so zero-terminated, with a zero byte
; before it too: the newline check needs no bounds test), at opt_prompt (without -f, -p's
; text stays there). Fatal "cannot read FILE", "NUL in prompt" (no_nul), or "prompt too long"
; at PROMPT_FILE_MAX bytes (the tokenizer's sizes then stay below 2^31); a usage error when -p
; was given too.
PROMPT_FILE_MAX = 1 shl 24
        mov     rbx, [rbp+V_FILE]
        test    rbx, rbx
        jz      .prompt_read
        cmp     dword [rbp+V_PROMPT], empty_text ; -p given too?
        jne     .err_prompt_and_file
        xor     eax, eax                ; standard input
        cmp     word [rbx], '-'         ; "-" and its zero byte
        jne     .open
        cmp     byte [rbp+V_CNV], 0     ; -cnv reads its turns there
        je      .opened
        jmp     .err_cnv
.open:
        push    rbx
        pop     rdi
        xor     esi, esi                ; O_RDONLY
        call    sys_open
        js      .cannot_read
.opened:
        push    rax                     ; fd
        mov     edi, PROMPT_FILE_MAX + 2
        call    alloc                   ; rsi = PROMPT_FILE_MAX + 2
        pop     rdi                     ; fd
        lea     edx, [rsi-2]            ; PROMPT_FILE_MAX
        lea     rsi, [rax+1]
        mov     [rbp+V_PROMPT], rsi
        push    rsi                     ; (for no_nul)
.read:
        mov     al, SYS_read            ; (its only call here: no wrapper)
        call    sys_call
.cannot_read:                           ; (SF set: the open's failure too)
        js      err_cannot_read         ; (a directory: EISDIR)
        jz      .end
        add     rsi, rax
        sub     edx, eax
        jnz     .read
        jmp     tokenize.err_long_prompt
.end:
        pop     rdi
        call    no_nul
        cmp     byte [rsi-1], 10
        jne     .prompt_read
        mov     [rsi-1], al             ; 0
.prompt_read:
        mov     rbx, [rbp+V_MODEL]
        call    load_model              ; validates everything the file holds; rbx = header
        mov     ecx, [rbx+HDR_MAX_CTX]
        mov     eax, [rbp+V_CTX]
        test    eax, eax
        jnz     .ctx_given
        mov     ah, DEFAULT_CTX shr 8   ; eax = DEFAULT_CTX
        cmp     eax, ecx
        cmova   eax, ecx
.ctx_given:
        cmp     eax, ecx
        ja      err_bad_c
        mov     [rbp+V_CTX_LEN], eax    ; (-n may exceed it: generation stops at a full context)
        call    model_setup             ; (clobbers r12-r15)
        ; --tokens counts what the context would not hold: ctx_len (<= 2^16: its top byte 0)
        ; 2^24 larger for tokenize alone (model_setup has sized the cache), which then maps
        ; 4 x 2^24 more bytes for ids, touched only as they come. A -f file has fewer than 2^24
        ; bytes, each at most one id, but a space three byte pieces in a model without U+2581:
        ; only such a prompt is still refused
        mov     al, [rbp+V_TOKENS]      ; (1 with --tokens, else 0; never with -cnv)
        mov     [rbp+V_CTX_LEN+3], al
        mov     eax, [rbx+HDR_BOS]      ; the first id (tokenize)
        mov     [rbp+V_PENDING], eax
        xor     r15d, r15d              ; from position 0
        call    tokenize                ; r12 -> ids, r13d = count (<= ctx_len)
        cmp     byte [rbp+V_TOKENS], 0
        je      .no_tokens

; The --tokens listing, "id id ... id\n", then exit 0. r12 -> ids, r13d = count (>= 1).
        push    r12
        pop     rsi
.id:                                    ; (the context's notice: rsi -> its position)
        lodsd
        push    ' ' - '0'               ; the separator, below the digits
        dec     r13d
        jnz     .divide
        pop     rcx
        push    10 - '0'                ; after the last id: a newline
.divide:
        push    10
        pop     rcx
.digit_out:
        cdq                             ; (ids < 2^24)
        div     ecx
        push    rdx
        test    eax, eax
        jnz     .digit_out
.put:
        pop     rax                     ; a digit, then the separator
        add     al, '0'
        push    rax
        call    put_byte
        pop     rax
        cmp     al, ' '
        ja      .put                    ; a digit
        je      .id                     ; a space: the next id
        jmp     generate.out            ; the newline: out, then exit 0
.no_tokens:
        mov     rdi, [rbp+V_LOGITS]
        test    rdi, rdi
        jz      generate
        push    rdi                     ; the path, for the error and the second open
        push    0x41                    ; O_WRONLY | O_CREAT: nothing truncated yet
        pop     rsi
        mov     edx, 420                ; 0644
        call    sys_open                ; (flags: test rax, rax)
        jns     logits_open
err_cannot_write:                       ; [rsp] = the path
        pop     rbx
        call    fatal_arg_here
        db      'cannot write ', 0
logits_open:                            ; (setup, continued)
        xchg    edi, eax
        lea     esi, [rbp+V_OUT_BUF+LOGITS_STAT]
        call    sys_fstat               ; the model file itself (a link, /proc/self/fd/N)?
        lea     edi, [rbp+V_OUT_BUF]    ; then truncating it would change the model and
        cmpsq                           ; fault its mapping: refuse (st_dev,
        jne     .other_file
        cmpsq                           ; st_ino)
        je      err_cannot_write
.other_file:
        pop     rdi
        push    rdi
        mov     esi, 0x201              ; O_WRONLY | O_TRUNC, the same file again
        call    sys_open                ; (flags: test rax, rax)
        js      err_cannot_write
        pop     rcx
        mov     [rbp+V_LOGITS_FD], eax

; generate: the generation loop (setup's tail): feed the prompt's ids in blocks of up to BLOCK
; (forward.asm), then sample, print and feed each new id (appended to the ids). r15d =
; position, r12 -> ids, r13d = prompt length (>= 1), r14d = ids still to generate (-n),
; rbx = header.
generate:                               ; (r15 = 0: tokenize)
        cmp     byte [rbp+V_CNV], 0
        jne     chat
.run:                                   ; (chat.asm: each turn)
        mov     r14d, [rbp+V_N]
.prompt:
        push    BLOCK
        pop     rdx
        mov     eax, r13d
        sub     eax, r15d               ; prompt ids not fed yet (> 0)
        cmp     edx, eax
        cmova   edx, eax
.block:
        lea     rsi, [r12+r15*4]
        mov     ecx, r15d
        add     r15d, edx               ; (the position after the block)
        mov     r8d, r13d
        call    forward                 ; rax -> the last row; rsi, edx: every row (--logits)
        push    rax                     ; the last row, for sampling
        mov     edi, [rbp+V_LOGITS_FD]
        test    edi, edi
        jz      .logits_done
        call    write_all
.logits_done:
        pop     rdi
        cmp     r15d, r13d
        jb      .prompt
        test    r14d, r14d
        jz      exit_ok                 ; -n 0: no text, not even its newline
        call    sample
        or      dword [rbp+V_PENDING], -1 ; (chat.asm: a reply that EOS or <end_of_turn>
        cmp     eax, [rbx+HDR_EOS]      ; ends leaves no id for the next turn to feed; one
        je      .text_end               ; that -n ends, its last id)
        cmp     eax, [rbx+HDR_EOT]
        je      .text_end
        mov     [r12+r15*4], eax
        mov     [rbp+V_PENDING], eax
        call    put_piece
        dec     r14d
        jz      .text_end
        push    1                       ; B: one id at a time from now on
        pop     rdx
        cmp     r15d, [rbp+V_CTX_LEN]
        jb      .block
.text_end:                              ; the generated text, even none, ends with one newline
        mov     al, 10
        call    put_byte
.out:                                   ; (the --tokens listing's end too)
        call    flush                   ; (out before the next turn's marker or the notice)
        cmp     byte [rbp+V_CNV], 0
        je      exit_ok
        cmp     r15d, [rbp+V_CTX_LEN]   ; a conversation (chat.asm): the next turn, but at
                                        ; a full context
        jb      chat_next
        mov     esi, msg_full           ; the notice: "gemma: context full (-c) at N", N the
        call    put_err                 ; position, listed by --tokens' code into stdout made
        push    r15                     ; stderr (dup2; edi = STDERR), then out and exit 0
        push    1                       ; one id, N
        pop     r13
        dec     byte [rbp+V_CNV]
        push    STDOUT
        pop     rsi
        mov     al, SYS_dup2
        call    sys_call
        push    rsp
        pop     rsi                     ; -> N
        jns     setup.id                ; (no stderr: no N either)
exit_ok:                                ; (every path here has flushed out_buf, or put nothing)
        xor     edi, edi
        jmp     sys_exit

; parse_digits: more decimal digits appended to rax (rax = rax * 10 + digit for each).
;   in: rsi string, rax   out: rax, rcx digits read (ZF: none), rsi -> after them
;   (err_bad_value when rax overflows 64 bits)   clobbers: rdx r11
parse_digits:
        push    rsi
        push    10
        pop     r11
.digit:
        movzx   ecx, byte [rsi]
        sub     ecx, '0'
        cmp     ecx, 9
        ja      .end
        mul     r11
        jc      err_bad_value
        add     rax, rcx
        jc      err_bad_value
        inc     rsi
        jmp     .digit
.end:
        pop     rcx
        sub     ecx, esi
        neg     ecx
        ret

; parse_value: the value of a K_INT or K_FLOAT option (the kind before the entry's slot byte),
; checked against the entry: nothing after it, at least the minimum (K_MIN1), at most the
; entry's maximum. K_INT: a decimal u64. K_FLOAT: a decimal number: digits, optionally '.'
; and digits (at least one digit in all, at most 2^63 - 1 as an integer; no exponent: its 34
; packed bytes went to conversation mode); value = integer * 10^-(digits after the point) in
; x87 extended precision, rounded to float32.
;   in: rsi string, rdi -> the entry's slot byte   out: rax value (float32 bits zero-extended)
;   (err_bad_value when malformed, beyond a u64 or out of the entry's range)
;   clobbers: rcx rdx rsi r8 r11 (x87 left empty)
parse_value:
        xor     eax, eax
        call    parse_digits
        test    byte [rdi-1], K_FLOAT - K_INT
        jz      .digits
        xor     r8d, r8d                ; decimal exponent
        cmp     byte [rsi], '.'
        jne     .mantissa_done
        inc     rsi
        push    rcx                     ; digits before the point
        call    parse_digits
        sub     r8d, ecx
        pop     rdx
        or      ecx, edx                ; digits in all
.mantissa_done:
        test    rax, rax
        js      err_bad_value           ; fild reads it signed
        push    rax
        fild    qword [rsp]             ; the integer
        mov     [rsp], r8               ; (zero-extended: the upper half of the result)
        fild    dword [rsp]
        fldl2t
        fmulp
        call    exp2_x87                ; 10^exponent (keeps rcx)
        fmulp
        fstp    dword [rsp]
        pop     rax
.digits:
        jrcxz   err_bad_value           ; no digits
        cmp     byte [rsi], 0           ; trailing characters
        jne     err_bad_value
        movzx   ecx, byte [rdi-1]
        shr     ecx, 3                  ; minimum: 0 or 1
        cmp     rax, rcx
        jb      err_bad_value
        movsxd  rcx, dword [rdi+1]      ; maximum (0xFFFFFFFF: any u64)
        cmp     rax, rcx
        ja      err_bad_value
        ret
err_bad_c:
        mov     ebx, opt_name_c
err_bad_value:                          ; (in short-jump reach of the parsers)
        call    fatal_arg_here
        db      'bad value for ', 0


; The options: name (bytes >= ' '), kind (< ' ': it ends the name), slot (offset from
; front_base, vars.asm), and for K_INT and K_FLOAT the maximum of the value as a dword
; (sign-extended: 0xFFFFFFFF allows any u64). Ends with a 0 byte.
opt_table:
        db      '-m', K_STR, V_MODEL and 0xFF
        db      '-p', K_STR, V_PROMPT and 0xFF
        db      '-n', K_INT, V_N and 0xFF
        dd      0x7FFFFFFF
        db      '--temp', K_FLOAT, V_TEMP and 0xFF
        dd      0x7F7FFFFF              ; finite, >= 0 (no sign accepted)
        db      '--top-p', K_FLOAT + K_MIN1, V_TOP_P and 0xFF
        dd      0x3F800000              ; (0, 1]
        db      '-s', K_INT, V_RNG and 0xFF
        dd      0xFFFFFFFF
        db      '-t', K_INT + K_MIN1, V_THREADS and 0xFF
        dd      256                     ; 1..256
opt_name_c:
        db      '-c', K_INT + K_MIN1, V_CTX and 0xFF
        dd      0x7FFFFFFF              ; further checked against the model's max_ctx
        db      '--tokens', K_FLAG, V_TOKENS and 0xFF
        db      '-cnv', K_FLAG, V_CNV and 0xFF
        db      '-sys', K_STR, V_SYS and 0xFF
        db      '--logits', K_STR, V_LOGITS and 0xFF
        db      '--baseline', K_FLAG, V_BASELINE and 0xFF
        db      '--avx2', K_FLAG, V_AVX2 and 0xFF
        db      '-f', K_STR, V_FILE and 0xFF
        db      '-h', K_FLAG, V_HELP and 0xFF
        db      '--help', K_FLAG, V_HELP and 0xFF
        db      0
