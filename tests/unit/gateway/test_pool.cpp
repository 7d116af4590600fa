// Unit tests for what the warm pool can serve (pool_refusal): Python kernels of ipykernel only,
// and a variable read only at start only with the value the warm kernels started with.
#include "pool.hpp"

#include <gtest/gtest.h>

#include <cstdlib>

namespace kgate::gw {
namespace {

KernelSpec ipykernel_spec() {
  KernelSpec s;
  s.name = "python3";
  s.language = "python";
  s.argv = {"/usr/bin/python3", "-m", "ipykernel_launcher", "-f", "{connection_file}"};
  return s;
}

TEST(PoolRefusal, OnlyIpykernelSpecsArePooled) {
  KernelSpec r = ipykernel_spec();
  r.name = "ir";
  r.language = "R";
  EXPECT_NE(pool_refusal(r, {}).find("not a Python kernel"), std::string::npos);
  KernelSpec other = ipykernel_spec();
  other.argv = {"/usr/bin/python3", "-m", "other_kernel"};
  EXPECT_NE(pool_refusal(other, {}).find("does not run ipykernel"), std::string::npos);
  EXPECT_EQ(pool_refusal(ipykernel_spec(), {{"MY_SETTING", "1"}}), "");
}

TEST(PoolRefusal, AStartOnlyVariableMustHaveTheWarmKernelsValue) {
  ::setenv("PYTHONKGATEUNIT", "same", 1);
  ::unsetenv("LD_KGATEUNIT");
  const KernelSpec spec = ipykernel_spec();
  EXPECT_EQ(pool_refusal(spec, {{"PYTHONKGATEUNIT", "same"}}), "");
  EXPECT_EQ(pool_refusal(spec, {{"PYTHONKGATEUNIT", "other"}}),
            "env PYTHONKGATEUNIT is read only when a Python process starts, and the warm kernels have another value");
  EXPECT_EQ(pool_refusal(spec, {{"LD_KGATEUNIT", "x"}}),
            "env LD_KGATEUNIT is read only when a Python process starts, and the warm kernels have none");
  // The spec's env wins over kgate's, ${VAR} expanded as at launch.
  KernelSpec with_env = spec;
  with_env.env["PYTHONKGATEUNIT"] = "${PYTHONKGATEUNIT}/lib";
  EXPECT_EQ(pool_refusal(with_env, {{"PYTHONKGATEUNIT", "same/lib"}}), "");
  EXPECT_NE(pool_refusal(with_env, {{"PYTHONKGATEUNIT", "same"}}), "");
  // Taken on at hand-out, whatever the warm kernels have.
  EXPECT_EQ(pool_refusal(spec, {{"PYTHONDONTWRITEBYTECODE", "1"}, {"PYTHONUNBUFFERED", "1"}}), "");
  ::unsetenv("PYTHONKGATEUNIT");
}

}  // namespace
}  // namespace kgate::gw
