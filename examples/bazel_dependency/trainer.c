/* A program in another Bazel workspace that links libmuon through @libmuon//:muon_c. */
#include <stdio.h>

#include <libmuon/muon.h>

int main(void) {
  muon_options_t options;
  muon_optimizer_t* opt = NULL;
  int32_t major = 0, minor = 0, patch = 0;
  if (muon_options_init(&options, sizeof options) != MUON_OK ||
      muon_create(&options, &opt) != MUON_OK) {
    fprintf(stderr, "libmuon: %s\n", muon_last_error_message());
    return 1;
  }
  muon_get_version(&major, &minor, &patch);
  printf("trainer linked libmuon %d.%d.%d\n", major, minor, patch);
  muon_destroy(opt);
  return 0;
}
