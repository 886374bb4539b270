// Built without the CUDA toolkit: nothing to time.
#include <cstdio>

int main() {
  std::fprintf(stderr, "ns_bench: built without the CUDA toolkit\n");
  return 1;
}
