// Sweep cases for domain parallelism. The random layouts of the sweep shard any dim,
// spatial ones included, with torch.chunk or random uneven sizes (size-0 shards too), on
// 1-D, 2-D (H and W at once) and 3-D meshes; each case checks outputs and all gradients.
#include <torch/version.h>

#include <utility>

#include "dist/sweep_case.h"
#include "shardtensor/shardtensor.h"

namespace shardtensor::testing {
namespace {

// Batch norm's running mean and variance for 4 channels, beside `x`: updated in place, so
// replicated like module buffers where x is a ShardTensor.
std::pair<at::Tensor, at::Tensor> running_statistics(const at::Tensor& x) {
  at::Tensor mean = at::zeros({4}, at::kDouble), var = at::ones({4}, at::kDouble);
  if (!is_shard_tensor(x)) return {mean, var};
  const DeviceMesh& mesh = spec(x).mesh();
  const Placements whole(mesh.ndim(), Replicate());
  return {distribute_tensor(mean, mesh, whole), distribute_tensor(var, mesh, whole)};
}

struct Conv {
  int64_t spatial, kernel, stride, padding, dilation, groups;
  bool transposed = false;
  int64_t output_padding = 0;
};

std::string describe(const Conv& c) {
  return std::string(c.transposed ? "conv_transpose" : "conv") + std::to_string(c.spatial) + "d k" + std::to_string(c.kernel) +
         " s" + std::to_string(c.stride) + " p" + std::to_string(c.padding) + " d" + std::to_string(c.dilation) + " g" +
         std::to_string(c.groups) + (c.output_padding ? " op" + std::to_string(c.output_padding) : "");
}

Case conv_case(const Conv& c) {
  const std::vector<int64_t> field = {11, 9, 7};
  std::vector<int64_t> input = {2, 4}, weight = c.transposed ? std::vector<int64_t>{4, 6 / c.groups} : std::vector<int64_t>{6, 4 / c.groups};
  for (int64_t i = 0; i < c.spatial; ++i) {
    input.push_back(field[i]);
    weight.push_back(c.kernel);
  }
  return on(describe(c), [=] { return Tensors{normal(input), normal(weight), normal({6})}; }, [c](const Tensors& x) {
    const std::vector<int64_t> s(c.spatial, c.stride), p(c.spatial, c.padding), d(c.spatial, c.dilation), op(c.spatial, c.output_padding);
    return at::convolution(x[0], x[1], x[2], s, p, d, c.transposed, op, c.groups);
  });
}

}  // namespace

std::vector<Case> spatial_cases() {
  std::vector<Case> cases;
  // Convolution: kernel sizes 1, 3, 5, 7; strides 1-2; paddings 0..k/2; dilation 1-2; groups.
  for (const Conv& c : std::vector<Conv>{{1, 3, 1, 1, 1, 1},
                                         {1, 5, 2, 2, 1, 1},
                                         {1, 7, 1, 3, 2, 2},
                                         {1, 1, 2, 0, 1, 1},
                                         {1, 5, 1, 0, 1, 2},
                                         {2, 3, 1, 1, 1, 1},
                                         {2, 5, 2, 2, 1, 2},
                                         {2, 3, 2, 0, 2, 1},
                                         {2, 7, 1, 3, 1, 1},
                                         {2, 1, 1, 0, 1, 2},
                                         {3, 3, 1, 1, 1, 1},
                                         {3, 3, 2, 0, 1, 2},
                                         {1, 3, 2, 1, 1, 1, true, 1},
                                         {2, 2, 2, 0, 1, 1, true},
                                         {2, 3, 1, 1, 2, 2, true},
                                         {2, 5, 3, 2, 1, 1, true, 2},
                                         {3, 3, 2, 1, 1, 1, true, 1}})
    cases.push_back(conv_case(c));
  cases.push_back(on("conv2d reflect/replicate/circular padding", [] { return Tensors{normal({2, 3, 9, 7}), normal({4, 3, 3, 3})}; },
                     [](const Tensors& x) {
                       return at::conv2d(at::pad(x[0], {1, 1, 1, 1}, "reflect"), x[1]) +
                              at::conv2d(at::pad(x[0], {1, 1, 1, 1}, "replicate"), x[1]) * 0.5 +
                              at::conv2d(at::pad(x[0], {1, 1, 2, 2}, "circular"), x[1]).narrow(2, 1, 9) * 0.25;
                     }));

  // Pooling.
  cases.push_back(on("max_pool1d/2d k3 s2 p1 ceil", [] { return Tensors{normal({2, 3, 11, 9})}; }, [](const Tensors& x) {
    return at::max_pool2d(x[0], {3, 3}, {2, 2}, {1, 1}, {1, 1}, true) + at::max_pool1d(x[0].flatten(0, 1), 3, 2, 1, 1, true).view({2, 3, 11, 5}).narrow(2, 0, 6).narrow(3, 0, 5);
  }));
  cases.push_back(on("max_pool2d k2 / k3 dilation 2", [] { return Tensors{normal({2, 3, 10, 9})}; }, [](const Tensors& x) {
    return at::max_pool2d(x[0], {2, 2}).sum() + at::max_pool2d(x[0], {3, 2}, {1, 2}, {1, 0}, {2, 1}).sum();
  }));
  cases.push_back(on("max_pool3d", [] { return Tensors{normal({1, 2, 7, 6, 5})}; },
                     [](const Tensors& x) { return at::max_pool3d(x[0], {3, 2, 2}, {2, 2, 1}, {1, 0, 1}, {1, 1, 1}, false); }));
  cases.push_back(on("avg_pool1d/2d count_include_pad ceil", [] { return Tensors{normal({2, 3, 11, 9})}; }, [](const Tensors& x) {
    return at::avg_pool2d(x[0], {3, 3}, {2, 2}, {1, 1}, true, false) + at::avg_pool2d(x[0], {3, 3}, {2, 2}, {1, 1}, true, true) +
           at::avg_pool2d(x[0], {3, 3}, {2, 2}, {1, 1}, true, true, 4);
  }));
  cases.push_back(on("avg_pool1d k2", [] { return Tensors{normal({2, 3, 11})}; },
                     [](const Tensors& x) { return at::avg_pool1d(x[0], {2}, {2}); }));
  cases.push_back(on("avg_pool3d", [] { return Tensors{normal({1, 2, 7, 6, 5})}; },
                     [](const Tensors& x) { return at::avg_pool3d(x[0], {3, 2, 2}, {2, 2, 1}, {1, 0, 1}, false, false); }));
  cases.push_back(on("adaptive_avg_pool2d/3d", [] { return Tensors{normal({2, 3, 12, 8, 6})}; }, [](const Tensors& x) {
    return at::adaptive_avg_pool3d(x[0], {4, 4, 3}).sum({2, 3, 4}) + at::adaptive_avg_pool2d(x[0].flatten(3), {6, 16}).sum({2, 3}) +
           at::adaptive_avg_pool2d(x[0].sum(4), {5, 3}).sum({2, 3}) + at::adaptive_avg_pool2d(x[0].sum(4), {1, 1}).squeeze(3).squeeze(2);
  }));

  // Upsampling: integer and arbitrary scales, align_corners both ways.
  cases.push_back(on("upsample nearest 1d/2d/3d", [] { return Tensors{normal({2, 3, 7, 5})}; }, [](const Tensors& x) {
    const at::Tensor& v = x[0];
    return at::upsample_nearest2d(v, {14, 10}) + at::upsample_nearest2d(v, {14, 10}, 2.0, 2.0) +
           at::upsample_nearest1d(v.flatten(0, 1), {10}).view({2, 3, 7, 10}).repeat({1, 1, 2, 1}) +
           at::upsample_nearest3d(v.unsqueeze(2), {1, 14, 10}).squeeze(2);
  }));
  cases.push_back(on("upsample nearest arbitrary / exact", [] { return Tensors{normal({2, 3, 7, 5})}; }, [](const Tensors& x) {
    return at::upsample_nearest2d(x[0], {11, 8}) + at::_upsample_nearest_exact2d(x[0], {11, 8}) +
           at::_upsample_nearest_exact1d(x[0].flatten(2), {88}).view({2, 3, 11, 8}) +
           at::_upsample_nearest_exact3d(x[0].unsqueeze(2), {2, 11, 8}).sum(2);
  }));
  for (bool align : {false, true})
    cases.push_back(on(std::string("upsample bilinear/linear/trilinear align_corners ") + (align ? "1" : "0"),
                       [] { return Tensors{normal({2, 3, 7, 5})}; }, [align](const Tensors& x) {
                         const at::Tensor& v = x[0];
                         return at::upsample_bilinear2d(v, {14, 10}, align) + at::upsample_bilinear2d(v, {17, 9}, align).sum() +
                                at::upsample_linear1d(v.flatten(2), {140}, align).view({2, 3, 14, 10}) +
                                at::upsample_trilinear3d(v.unsqueeze(2), {3, 14, 10}, align).sum(2);
                       }));
  // The .vec overloads, F.interpolate's path: by scale factors, or by an output size.
  cases.push_back(on("upsample .vec overloads (scale factors or size)", [] { return Tensors{normal({2, 3, 7, 5})}; }, [](const Tensors& x) {
    const at::Tensor& v = x[0];
    const std::vector<double> twice{2.0, 2.0};
    const std::vector<int64_t> size{14, 10};
    const c10::optional<at::ArrayRef<double>> no_scales;
    return at::upsample_bilinear2d(v, c10::nullopt, false, twice) + at::upsample_nearest2d(v, c10::nullopt, twice) +
           at::upsample_bicubic2d(v, at::OptionalIntArrayRef(size), true, no_scales) +
           at::upsample_linear1d(v.flatten(2), c10::nullopt, false, std::vector<double>{4.0}).view({2, 3, 14, 10});
  }));
  // Bicubic: four taps, clamped at the edges; downscaling too, and a scale factor given.
  for (bool align : {false, true})
    cases.push_back(on(std::string("upsample bicubic align_corners ") + (align ? "1" : "0"), [] { return Tensors{normal({2, 3, 7, 5})}; },
                       [align](const Tensors& x) {
                         const at::Tensor& v = x[0];
                         return at::upsample_bicubic2d(v, {14, 10}, align) + at::upsample_bicubic2d(v, {14, 10}, align, 2.0, 2.0) +
                                at::upsample_bicubic2d(v, {4, 3}, align).sum() + at::upsample_bicubic2d(v, {17, 9}, align).sum();
                       }));

  // Padding on sharded dims.
  cases.push_back(on("constant_pad_nd (grow and crop)", [] { return Tensors{normal({2, 3, 9, 7})}; }, [](const Tensors& x) {
    return at::constant_pad_nd(x[0], {2, 1, 3, 0}, 0.5).narrow(3, 0, 8) + at::constant_pad_nd(x[0], {-1, 2, 1, 2}, 0.0).sum(1, true);
  }));
  cases.push_back(on("reflection/replication pad 1d/2d/3d", [] { return Tensors{normal({2, 3, 9, 7})}; }, [](const Tensors& x) {
    const at::Tensor& v = x[0];
    return at::reflection_pad2d(v, {2, 1, 3, 2}) + at::replication_pad2d(v, {2, 1, 3, 2}) * 0.5 +
           at::reflection_pad1d(v.flatten(0, 1), {2, 1}).view({2, 3, 9, 10}).repeat({1, 1, 2, 1}).narrow(2, 0, 14) +
           at::replication_pad1d(v.flatten(0, 1), {2, 1}).view({2, 3, 9, 10}).repeat({1, 1, 2, 1}).narrow(2, 0, 14) +
           at::reflection_pad3d(v.unsqueeze(2), {2, 1, 3, 2, 0, 0}).squeeze(2) + at::replication_pad3d(v.unsqueeze(2), {2, 1, 3, 2, 1, 1}).sum(2);
  }));

  cases.push_back(on("circular pad 1d/2d/3d", [] { return Tensors{normal({2, 3, 9, 7})}; }, [](const Tensors& x) {
    const at::Tensor& v = x[0];
    return at::pad(v, {3, 2, 1, 4}, "circular").narrow(2, 0, 9).narrow(3, 0, 7) +
           at::pad(v.flatten(0, 1), {2, 5}, "circular").view({2, 3, 9, 14}).narrow(3, 0, 7) +
           at::pad(v.unsqueeze(2), {1, 1, 2, 2, 0, 0}, "circular").squeeze(2).narrow(2, 0, 9).narrow(3, 0, 7);
  }));

  // Normalisation over sharded batch and spatial dims.
  cases.push_back(on("batch_norm training", [] { return Tensors{normal({3, 4, 7, 5}), normal({4}), normal({4})}; },
                     [](const Tensors& x) {
                       auto [running_mean, running_var] = running_statistics(x[0]);
                       at::Tensor out = at::batch_norm(x[0] * 2 + 1, x[1], x[2], running_mean, running_var, true, 0.1, 1e-5, false);
                       return out + (running_mean * 3 + running_var).view({1, 4, 1, 1});  // the updated statistics count too
                     }));
#if TORCH_VERSION_MAJOR >= 2
  // What batch_norm decomposes into while torch.compile traces (torch 2.x).
  cases.push_back(on("_native_batch_norm_legit training", [] { return Tensors{normal({3, 4, 7, 5}), normal({4}), normal({4})}; },
                     [](const Tensors& x) {
                       auto [running_mean, running_var] = running_statistics(x[0]);
                       at::Tensor out = std::get<0>(at::_native_batch_norm_legit(x[0] - 1, x[1], x[2], running_mean, running_var, true, 0.1, 1e-5));
                       return out + (running_mean * 3 + running_var).view({1, 4, 1, 1});
                     }));
  // torch 2.x's batch norm without a training argument (the update says which), and the legit
  // form without running statistics.
  cases.push_back(on("_batch_norm_with_update / _no_update / legit no_stats", [] { return Tensors{normal({3, 4, 7, 5}), normal({4}), normal({4})}; },
                     [](const Tensors& x) {
                       auto [running_mean, running_var] = running_statistics(x[0]);
                       at::Tensor out = std::get<0>(at::_batch_norm_with_update(x[0] - 1, x[1], x[2], running_mean, running_var, 0.1, 1e-5));
                       at::Tensor eval = std::get<0>(at::_batch_norm_no_update(x[0], x[1], x[2], running_mean, running_var, 0.1, 1e-5));
                       at::Tensor no_stats = std::get<0>(at::_native_batch_norm_legit(x[0] * 2, x[1], x[2], true, 0.1, 1e-5));
                       return out + eval * 2 + no_stats + (running_mean * 3 + running_var).view({1, 4, 1, 1});
                     }));
  // ... and what eval mode's batch_norm decomposes into there.
  cases.push_back(on("_native_batch_norm_legit_no_training", [] { return Tensors{normal({3, 4, 7, 5}), normal({4}), normal({4}), unit({4}), unit({4})}; },
                     [](const Tensors& x) { return std::get<0>(at::_native_batch_norm_legit_no_training(x[0] * 2, x[1], x[2], x[3], x[4], 0.1, 1e-5)); },
                     /*constants=*/{3, 4}));
#endif
  cases.push_back(on("batch_norm eval / instance_norm", [] { return Tensors{normal({3, 4, 7, 5}), normal({4}), normal({4}), unit({4}), unit({4})}; },
                     [](const Tensors& x) {
                       return at::batch_norm(x[0], x[1], x[2], x[3], x[4], false, 0.1, 1e-5, false) +
                              at::instance_norm(x[0], x[1], x[2], {}, {}, true, 0.1, 1e-5, false);
                     },
                     /*constants=*/{3, 4}));
  cases.push_back(on("group_norm", [] { return Tensors{normal({3, 4, 7, 5}), normal({4}), normal({4})}; }, [](const Tensors& x) {
    return at::group_norm(x[0] * 3 - 1, 2, x[1], x[2]) + at::group_norm(x[0], 4) + at::group_norm(x[0].flatten(2), 1, x[1], x[2]).view({3, 4, 7, 5});
  }));
  return cases;
}

}  // namespace shardtensor::testing
