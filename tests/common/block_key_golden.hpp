// Golden block keys shared by block_key_test.cpp (in-process) and block_key_process_test.cpp (the mc-store
// binary): digests of tokens 0..1023, block size 512, seed 0 (independently: xxhsum -H3 over the same bytes).
#pragma once

#ifndef MC_GOLDEN_BLOCK0
#define MC_GOLDEN_BLOCK0 "0xed23844e189677f1"
#define MC_GOLDEN_BLOCK1 "0x7629bc6b90b4419c"
#endif
