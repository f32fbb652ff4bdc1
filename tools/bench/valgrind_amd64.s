#include "textflag.h"

// func valgrindRequest(args *[6]uint64) uint64
//
// Valgrind's client request on amd64 (valgrind.h, VALGRIND_DO_CLIENT_REQUEST_EXPR): the
// rotations of DI by 128 bits in all leave it unchanged, and tell valgrind that the
// exchange after them is a request whose arguments AX points to; its answer is in DX, 0
// when the program runs outside valgrind.
TEXT ·valgrindRequest(SB), NOSPLIT, $0-16
	MOVQ args+0(FP), AX
	MOVQ $0, DX
	ROLQ $3, DI
	ROLQ $13, DI
	ROLQ $61, DI
	ROLQ $51, DI
	XCHGQ BX, BX
	MOVQ DX, ret+8(FP)
	RET
