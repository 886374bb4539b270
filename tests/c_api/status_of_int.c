/* muon_status_string called from C with any int: in C an enum object may hold
 * any value of its compatible integer type, so a C host may pass a number the
 * header does not declare (a C++ caller could not without undefined
 * behaviour of its own). */
#include "tests/c_api/status_of_int.h"

const char* muon_test_status_string_of_int(int value) {
  return muon_status_string((muon_status_t)value);
}
