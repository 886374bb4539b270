/* See status_of_int.c. */
#ifndef LIBMUON_TESTS_C_API_STATUS_OF_INT_H_
#define LIBMUON_TESTS_C_API_STATUS_OF_INT_H_

#include "libmuon/muon.h"

#ifdef __cplusplus
extern "C" {
#endif

const char* muon_test_status_string_of_int(int value);

#ifdef __cplusplus
}
#endif

#endif
