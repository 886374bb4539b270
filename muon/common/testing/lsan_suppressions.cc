// LeakSanitizer's suppressions for every C++ test of libmuon (muon_cc_test
// links this in): what it reports that is not libmuon's.
//
// libgomp: omp_set_num_threads on a thread gives it a task block of its own
// (216 bytes), and libgomp later swaps that block for a team's and loses the
// first one. Seen in native_bf16_test on an Intel Xeon whose AMX and
// AVX512-BF16 the hypervisor hides (the fp32 kernel's OpenMP team there).
// Bounded: one block per thread that sets its thread count.
extern "C" __attribute__((visibility("default"))) const char* __lsan_default_suppressions() {
  return "leak:libgomp.so\n";
}
