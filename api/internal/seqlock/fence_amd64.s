#include "textflag.h"

// func loadFence()
TEXT ·loadFence(SB), NOSPLIT|NOFRAME, $0-0
	RET
