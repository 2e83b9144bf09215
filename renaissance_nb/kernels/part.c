/* Compiled into every part of the library but the core (native_build.py, PARTS): the core's thread pool and
 * fork flag, bound by address when the part is loaded, so that a plan's passes run on one pool whichever
 * part holds them (native.py, chosen_for, says why one). */
#ifndef RNB_PART /* the flag native_build.py gives a part's sources */
#define RNB_PART
#endif
#include "native.h"

void (*rnb_parallel_in_core)(int threads, i64 blocks, rnb_block_fn fn, void *ctx) = 0;
volatile int *rnb_forked_in_core = 0;

int rnb_part_link(void *parallel, void *forked) {
    rnb_parallel_in_core = (void (*)(int, i64, rnb_block_fn, void *))parallel;
    rnb_forked_in_core = (volatile int *)forked;
    return RNB_CHUNKS; /* native_build.py checks it is the core's */
}
