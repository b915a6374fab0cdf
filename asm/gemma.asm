; gemma.asm: the entry file of the engine. It lists the include order and the segments;
; every concern lives in its own file. Builds with `python -m builder` (keystone, verified)
; and with `fasm asm/gemma.asm OUT` (the independent check).

format ELF64 executable 3
entry start

segment readable executable

include 'sys.asm'               ; the only file that holds `syscall`
include 'main.asm'              ; start-up and command line
include 'text.asm'              ; read-only strings

segment readable writeable

include 'vars.asm'              ; zero-initialised state (bss)
