// The last phases of BuildPlan (plan.cc): from a plan's parameters and their
// holders, its units (one per matrix with elements), who orthogonalizes each
// one (assignment.h), and in which exchange round.
#ifndef MUON_SHARDING_PLAN_UNITS_H_
#define MUON_SHARDING_PLAN_UNITS_H_

#include "absl/status/status.h"
#include "muon/sharding/plan.h"

namespace muon {

// Fills plan->units (with their owners, rounds and widths, split matrices'
// parts in a last round of their own) and plan->rounds from plan->params,
// their holders placed. Errors: a custom assignment's, and a split's.
absl::Status AssignUnits(Plan* plan, int world, const PlanOptions& options);

}  // namespace muon

#endif  // MUON_SHARDING_PLAN_UNITS_H_
