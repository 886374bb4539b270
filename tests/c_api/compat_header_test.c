/* A caller written against libmuon 0.6 includes "capi/muon.h": for the 0.7
 * release that path forwards to <libmuon/muon.h>, and such a caller compiles,
 * links and gets the defaults of the header it now reads. */
#include "capi/muon.h"

#include <stdio.h>

int main(void) {
  muon_options_t opts;
  if (muon_options_init(&opts, sizeof opts) != MUON_OK) {
    fprintf(stderr, "muon_options_init: %s\n", muon_last_error_message());
    return 1;
  }
  if (opts.ns_steps != 5 || MUON_VERSION_MAJOR != 0 || MUON_VERSION_MINOR != 7) {
    fprintf(stderr, "ns_steps %d, version %d.%d\n", (int)opts.ns_steps, MUON_VERSION_MAJOR,
            MUON_VERSION_MINOR);
    return 1;
  }
  printf("capi/muon.h forwards to libmuon %d.%d.%d\n", MUON_VERSION_MAJOR, MUON_VERSION_MINOR,
         MUON_VERSION_PATCH);
  return 0;
}
