// The one model on a backend whose memory the host cannot read ("cpu-strict",
// backend/cpu/strict_backend.hpp), against the same model on "cpu": the CPU stand-in for the GPU
// tests (tests/gpu/test_gpu_model.cpp runs the same harness on "cuda"). cpu-strict computes with
// the CPU backend's ops, so every result must be bit-identical; and any host read or write of the
// model's device memory (parameters, gradients, moments, activations, scratch) faults, so a
// passing run shows the step is device-resident: the host touches it only through queue copies.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "device_model_harness.hpp"

using namespace tetrad;
using namespace tetrad::parallel;
using device_model::Trace;

namespace {

std::unique_ptr<backend::Backend> strict() { return backend::create("cpu-strict"); }

void expect_identical(const Trace& a, const Trace& b, const std::string& what) {
  ASSERT_EQ(a.losses.size(), b.losses.size()) << what;
  for (size_t s = 0; s < a.losses.size(); ++s) {
    EXPECT_EQ(a.losses[s], b.losses[s]) << what << ": loss of step " << s;
    EXPECT_EQ(a.grad_norms[s], b.grad_norms[s]) << what << ": grad norm of step " << s;
  }
  ASSERT_EQ(a.weights.size(), b.weights.size()) << what;
  for (size_t i = 0; i < a.weights.size(); ++i) {
    ASSERT_EQ(a.weights[i].size(), b.weights[i].size());
    EXPECT_EQ(std::memcmp(a.weights[i].data(), b.weights[i].data(), a.weights[i].size() * 4), 0)
        << what << ": weights of tensor " << i;
    EXPECT_EQ(std::memcmp(a.m[i].data(), b.m[i].data(), a.m[i].size() * 4), 0)
        << what << ": first moment of tensor " << i;
    EXPECT_EQ(std::memcmp(a.v[i].data(), b.v[i].data(), a.v[i].size() * 4), 0)
        << what << ": second moment of tensor " << i;
  }
}

struct Case {
  Family family;
  Recompute recompute;
  backend::Precision precision;
  const char* name;
};

class DeviceModel : public ::testing::TestWithParam<Case> {};

TEST_P(DeviceModel, TrainsBitIdenticalToTheCpuBackend) {
  const Case c = GetParam();
  const ModelConfig mc = device_model::tiny_model(c.family);
  ParallelOptions po;
  po.recompute = c.recompute;
  po.precision = c.precision;
  ProcessGroups g;
  const Trace ref = device_model::train(mc, g, po, device_model::kSteps);
  auto be = strict();
  po.device = be.get();
  const Trace dev = device_model::train(mc, g, po, device_model::kSteps);
  expect_identical(ref, dev, c.name);
  // The loss went down: the run trained (it is not two identical no-ops).
  EXPECT_LT(dev.losses.back(), dev.losses.front());
}

INSTANTIATE_TEST_SUITE_P(
    Models, DeviceModel,
    ::testing::Values(Case{Family::GPT2, Recompute::None, backend::Precision::FP32, "gpt2_fp32"},
                      Case{Family::Llama, Recompute::None, backend::Precision::FP32, "llama_fp32"},
                      Case{Family::GPT2, Recompute::Full, backend::Precision::BF16, "gpt2_bf16_full"},
                      Case{Family::Llama, Recompute::Selective, backend::Precision::BF16,
                           "llama_bf16_selective"}),
    [](const auto& info) { return std::string(info.param.name); });

// Checkpoint through the device: whole tensors and moments out of a strict model after some
// steps (gather_tensor / gather_state_tensor: device -> host), into a fresh strict model
// (set_tensor / scatter_state_tensor: host -> device), and the resumed run continues exactly as
// the uninterrupted one.
TEST(DeviceModelCheckpoint, SaveAndResumeThroughDeviceMemory) {
  const ModelConfig mc = device_model::tiny_model(Family::Llama);
  auto be = strict();
  ParallelOptions po;
  po.device = be.get();
  ProcessGroups g;
  const Trace whole = device_model::train(mc, g, po, device_model::kSteps);
  device_model::Saved saved;
  device_model::train(mc, g, po, device_model::kSteps / 2, nullptr, &saved);
  const Trace resumed = device_model::train(mc, g, po, device_model::kSteps, &saved);
  ASSERT_EQ(resumed.losses.size(), size_t(device_model::kSteps - device_model::kSteps / 2));
  for (size_t s = 0; s < resumed.losses.size(); ++s)
    EXPECT_EQ(resumed.losses[s], whole.losses[s + device_model::kSteps / 2]) << "step " << s;
  for (size_t i = 0; i < whole.weights.size(); ++i)
    EXPECT_EQ(std::memcmp(whole.weights[i].data(), resumed.weights[i].data(),
                          whole.weights[i].size() * 4), 0) << "tensor " << i;
}

// Inference on the device: greedy tokens, whole-vocabulary logits and KV-cache decoding agree
// bit for bit with the cpu backend.
TEST(DeviceModelInference, LogitsGreedyAndDecodeMatchTheCpu) {
  const ModelConfig mc = device_model::tiny_model(Family::Llama);
  auto be = strict();
  ProcessGroups g;
  ParallelOptions cpu_opt, dev_opt;
  dev_opt.device = be.get();
  ParallelTransformer a(mc, g, 2, mc.max_seq, cpu_opt), b(mc, g, 2, mc.max_seq, dev_opt);
  a.init_weights(5);
  b.init_weights(5);
  std::vector<int32_t> x(2 * 8);
  for (size_t i = 0; i < x.size(); ++i) x[i] = int32_t((i * 37 + 11) % mc.vocab_size);
  const int64_t V = mc.vocab_size;
  std::vector<float> la(a.forward_logits(x.data(), 2, 8), a.forward_logits(x.data(), 2, 8) + 16 * V);
  std::vector<float> lb(b.forward_logits(x.data(), 2, 8), b.forward_logits(x.data(), 2, 8) + 16 * V);
  EXPECT_EQ(std::memcmp(la.data(), lb.data(), la.size() * 4), 0);
  EXPECT_EQ(a.greedy_next_tokens(x.data(), 2, 8), b.greedy_next_tokens(x.data(), 2, 8));
  a.start_cache(2);
  b.start_cache(2);
  const float* da = a.decode(x.data(), 2, 8);
  std::vector<float> first(da, da + 2 * V);
  const float* db = b.decode(x.data(), 2, 8);
  EXPECT_EQ(std::memcmp(first.data(), db, first.size() * 4), 0);
  std::vector<int32_t> next = {3, 4};
  da = a.decode(next.data(), 2, 1);
  first.assign(da, da + 2 * V);
  db = b.decode(next.data(), 2, 1);
  EXPECT_EQ(std::memcmp(first.data(), db, first.size() * 4), 0);
}

// What the emulation catches: handing the model's device memory to the host faults.
TEST(DeviceModelMemory, TheModelsBuffersAreNotHostMemory) {
  const ModelConfig mc = device_model::tiny_model(Family::GPT2);
  auto be = strict();
  ProcessGroups g;
  ParallelOptions po;
  po.device = be.get();
  ParallelTransformer m(mc, g, 2, 8, po);
  EXPECT_FALSE(be->host_readable(m.param_data()));
  EXPECT_FALSE(be->host_readable(m.grads()));
  const float* p = m.param_data();
  EXPECT_DEATH({ volatile float f = p[0]; (void)f; }, "");
}

}  // namespace
