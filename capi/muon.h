/* Moved: the public header is <libmuon/muon.h> (include/libmuon/muon.h).
 * This forwarding header keeps `#include "capi/muon.h"` compiling for one
 * release (0.7); it goes in 0.8. */
#include "libmuon/muon.h"
