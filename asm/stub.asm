; stub.asm: the entry file of the packed ./gemma. The build assembles asm/gemma.asm into the
; image (gemma.elf), packs the image's bytes (builder/asm/pack.py), then assembles this file
; with the image's addresses as constants (fasm's -d; below) and appends the packed bytes at
; `payload`. At start-up the stub maps the image's pages where the image was linked, and
; below them a page for the decoder's field tables and the decoder's table; decodes the field
; tables and the image into place, unmaps what lies below the image, makes the image's code
; read+execute and jumps to the image's entry with the stack as Linux hands it to a new
; program (rsp, argc, argv, envp, auxv), DF clear and the x87 and SSE state untouched; the
; general registers hold what the decoder and the system calls left (the image reads none
; before writing it). The second file, after sys.asm, that holds `syscall`.
;
; Constants from the build:
;   IMAGE_BASE      the image's first page (its link base)
;   IMAGE_TEXT      the address of the image's first code byte: the field tables end there
;   IMAGE_BYTES     the bytes to decode: .text (and .data after it, when there is one)
;   IMAGE_CODE_END  the end of .text: its pages become read+execute
;   IMAGE_END       the end of .bss: the image's pages end on the page boundary after it
;   IMAGE_ENTRY     the image's entry point
;   PACK_HASH_AT    where the decoder reads PACK_HASH (8 bytes): the stub's PT_LOAD header's
;                   p_paddr, which no loader reads (linker/link.py writes it there)

format ELF64 executable 3
entry stub_start

segment readable executable

include 'unpack.asm'            ; the decoder

PAGE_MASK       = 0xFFF
IMAGE_MAP_END   = (IMAGE_END + PAGE_MASK) and not PAGE_MASK
UNPACK_OUT      = IMAGE_TEXT - PACK_TABLES                  ; the field tables, then the image
MAP_BASE        = (UNPACK_OUT and not PAGE_MASK) - PACK_SCRATCH    ; the table, below them
IMAGE_CODE_MAP  = ((IMAGE_CODE_END + PAGE_MASK) and not PAGE_MASK) - IMAGE_BASE

SYS_write       = 1
SYS_mmap        = 9
SYS_mprotect    = 10
SYS_munmap      = 11
SYS_exit        = 60

PROT_READ       = 1
PROT_WRITE      = 2
PROT_EXEC       = 4
MAP_STUB        = 0x108022      ; MAP_FIXED_NOREPLACE (a hint before Linux 4.17) |
                                ; MAP_POPULATE (one call faults the table's 256 pages in, faster
                                ; than 256 faults) | MAP_ANONYMOUS | MAP_PRIVATE

; stub_start: the packed program's entry point.
;   in: rsp -> argc, argv[], 0, envp[], auxv; every other general register 0 (Linux's ELF
;   loader; rdx and rax are set by byte moves)   out: never returns (jumps to IMAGE_ENTRY)
stub_start:
        ; mmap(MAP_BASE, table + field tables' pages + image pages, read+write, private
        ; anonymous, fd 0, 0): Linux ignores fd with MAP_ANONYMOUS; every general register
        ; but rsp is zero at a program's first instruction (the x86-64 ELF loader clears
        ; them), so byte moves set rdx and rax
        mov     edi, MAP_BASE
        mov     esi, IMAGE_MAP_END - MAP_BASE
        mov     dl, PROT_READ or PROT_WRITE
        mov     r10d, MAP_STUB
        mov     al, SYS_mmap
        syscall
        cmp     rax, rdi                ; -errno, or elsewhere (a hint not taken)
        jne     stub_no_memory
        xchg    ecx, eax                ; the table, first
        mov     edi, UNPACK_OUT
        mov     esi, payload
        mov     dx, PACK_TABLES + IMAGE_BYTES   ; (below 2^16; rdx's other bytes are 0)
        call    unpack                  ; (r11: the table)
        ; munmap(the table and the field tables' page: all below the image)
        mov     rdi, r11
        mov     esi, IMAGE_BASE - MAP_BASE
        push    SYS_munmap
        pop     rax
        syscall
        ; mprotect(IMAGE_BASE, the code's pages, read+execute): munmap left rdi, rsi and
        ; its result, 0
        add     edi, esi                ; IMAGE_BASE
        mov     esi, IMAGE_CODE_MAP
        push    PROT_READ or PROT_EXEC
        pop     rdx
        mov     al, SYS_mprotect
        syscall
        jmp     IMAGE_ENTRY             ; rsp as the kernel left it

; stub_no_memory: "gemma: out of memory" on stderr, exit status 1.
stub_no_memory:
        push    2                       ; STDERR
        pop     rdi
        mov     esi, stub_msg_no_memory
        mov     dl, stub_msg_no_memory.end - stub_msg_no_memory   ; (rdx: PROT_READ or
                                        ; PROT_WRITE, its other bytes 0 from the start)
        push    SYS_write
        pop     rax
        syscall
        dec     edi                     ; STDERR - 1 = EXIT_ERROR
        push    SYS_exit                ; (one thread: exit is exit_group)
        pop     rax
        syscall

stub_msg_no_memory:
        db      'gemma: out of memory', 10
.end:

payload:                                ; the build appends the packed image here
