#include "kernels/cpu/isa.h"

#include "kernels/cpu/cpu_features.h"

namespace megakern {

namespace {

const IntKernelBuild kBuilds[] = {
    {KernelIsa::avx2, false, matmul_rows_i16_avx2, matmul_rows_fast_r8_avx2, matmul_rows_fast_r8_few_avx2},
    {KernelIsa::avx_vnni, true, matmul_rows_i16_vnni, matmul_rows_fast_r8_vnni, matmul_rows_fast_r8_few_vnni},
    {KernelIsa::avx512_vnni, true, matmul_rows_i16_evex, matmul_rows_fast_r8_evex, matmul_rows_fast_r8_few_evex},
};

bool runs(const CpuFeatures& f, KernelIsa isa) {
  const bool avx2 = f.avx2 && f.fma && f.f16c;
  switch (isa) {
    case KernelIsa::scalar: return true;
    case KernelIsa::avx2: return avx2;
    case KernelIsa::avx_vnni: return avx2 && f.avxvnni;
    case KernelIsa::avx512_vnni: return avx2 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512vnni;
  }
  return false;
}

}  // namespace

const char* isa_name(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::scalar: return "scalar";
    case KernelIsa::avx2: return "avx2";
    case KernelIsa::avx_vnni: return "avx-vnni";
    case KernelIsa::avx512_vnni: return "avx512-vnni";
  }
  return "?";
}

std::span<const IntKernelBuild> int_kernel_builds() { return kBuilds; }

bool host_runs(KernelIsa isa) { return runs(host_cpu_features(), isa); }

const IntKernelBuild* active_int_build() {
  static const IntKernelBuild* b = [] {
    const IntKernelBuild* best = nullptr;
    if (!use_avx2()) return best;
    for (const IntKernelBuild& k : kBuilds)
      if (runs(cpu_features(), k.isa)) best = &k;
    return best;
  }();
  return b;
}

KernelIsa active_isa() {
  const IntKernelBuild* b = active_int_build();
  return b ? b->isa : KernelIsa::scalar;
}

std::string isa_report() {
  std::string host, missing;
  for (const IntKernelBuild& k : kBuilds) {
    std::string& to = host_runs(k.isa) ? host : missing;
    if (!to.empty()) to += ' ';
    to += isa_name(k.isa);
  }
  std::string s = isa_name(active_isa());
  s += " (host runs: " + (host.empty() ? std::string("scalar only") : host);
  if (!missing.empty()) s += "; not on this host: " + missing;
  return s + ")";
}

}  // namespace megakern
