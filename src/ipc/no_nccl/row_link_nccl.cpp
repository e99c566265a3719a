// Built without NCCL: MPI ranks hand their rows over through the host.
#include "ipc/row_link.h"

namespace moeserve::ipc::nccl {

bool built() { return false; }

Result<std::unique_ptr<RowLink>> open(const LinkOptions&) {
  return make_error(StatusCode::kUnsupported,
                    "this moeserve was built without NCCL (rebuild with CUDA, MPI and NCCL found, "
                    "-DMOESERVE_NCCL=ON)");
}

}  // namespace moeserve::ipc::nccl
