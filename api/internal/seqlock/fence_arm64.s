#include "textflag.h"

// func loadFence()
TEXT ·loadFence(SB), NOSPLIT|NOFRAME, $0-0
	DMB	$0x9 // ISHLD: loads before complete before loads after
	RET
