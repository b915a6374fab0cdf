; main.asm: process start-up and the command line.

; start: the ELF entry point. The kernel leaves argc at [rsp], argv after it.
;   in: rsp -> argc, argv[], 0, envp[]   out: never returns
start:
        mov     [argv_base], rsp        ; the engine proper is not assembled yet
        jmp     usage
