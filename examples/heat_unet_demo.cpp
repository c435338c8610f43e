// The main demo: a small U-Net learns one explicit step of the 2-D heat equation on a field
// of an awkward size (250 x 190), split over space across the ranks with uneven shards, and
// trains to the same losses as the same model on one process.
//
//   shardrun -n 4 ./examples/heat_unet_demo                 H split over 4 ranks, unevenly
//   shardrun -n 4 ./examples/heat_unet_demo --mesh 2x2      H and W split over a 2 x 2 mesh
//   options: --steps N (50)  --out DIR (demo_output)  --mesh N | AxB
//            --checkpoint DIR --save-after K   save the training state after K steps
//            --resume DIR                      continue from a saved state, on any mesh
//
// Every layer is ordinary libtorch (at::conv2d, group_norm, batch_norm, max_pool2d, nearest
// upsampling, cat for the skip connection, mse_loss, torch::optim::Adam); the sharded run
// differs from the single-process one only in its inputs and parameters being ShardTensors.
// Rank 0 trains the single-process copy beside it and prints, per step, both losses, their
// relative difference, the sharded step's time and its collectives (CommDebugMode). At the
// end it writes the predicted field with the shard boundaries drawn, and the loss curves.
//
// A checkpoint (shardtensor::checkpoint) holds the model's parameters and buffers, Adam's
// moments and step counts, and the step reached. A run resumed from it on another mesh or
// world size prints the same losses, step for step, as the run that saved it would have.
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim/adam.h>

#include <type_traits>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <sstream>

#include "png_writer.h"
#include "shardtensor/checkpoint.h"
#include "shardtensor/shardtensor.h"

using namespace shardtensor;

namespace {

constexpr int64_t kHeight = 250, kWidth = 190, kBatch = 2, kFields = 4;

// Double precision: in float32, 50 Adam steps amplify the last-bit differences of a
// differently ordered sum (a convolution on a halo window vs. the whole field) to ~3e-4 of
// a loss that has fallen 1000-fold; in float64 the two runs agree to ~1e-12.
void use_double_precision() { at::set_default_dtype(caffe2::TypeMeta::Make<double>()); }

struct Options {
  std::vector<int64_t> mesh_shape;
  int steps = 50;
  std::string out_dir = "demo_output";
  std::string checkpoint_dir;  // with save_after: where to save
  int save_after = -1;
  std::string resume_dir;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&] {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return std::string(argv[++i]);
    };
    if (a == "--steps") {
      o.steps = std::stoi(value());
    } else if (a == "--out") {
      o.out_dir = value();
    } else if (a == "--checkpoint") {
      o.checkpoint_dir = value();
    } else if (a == "--save-after") {
      o.save_after = std::stoi(value());
    } else if (a == "--resume") {
      o.resume_dir = value();
    } else if (a == "--mesh") {
      std::stringstream ss(value());
      for (std::string part; std::getline(ss, part, 'x');) o.mesh_shape.push_back(std::stoll(part));
    } else {
      throw std::invalid_argument("unknown option " + a +
                                  " (use --steps N, --out DIR, --mesh N or AxB, --checkpoint DIR --save-after K, --resume DIR)");
    }
  }
  if (o.checkpoint_dir.empty() != (o.save_after < 0))
    throw std::invalid_argument("--checkpoint DIR and --save-after K go together (got only one of them)");
  if (o.mesh_shape.empty()) o.mesh_shape = {world_size()};
  return o;
}

// Uneven on purpose: alternately 15% more and less than an even share. Boundaries are even,
// so that the 2x2 pooling windows do not straddle shards and the upsampled decoder features
// land with the same boundaries as the skip connection (any split is correct; an odd one
// costs a halo exchange in the pooling and a realignment before the cat).
std::vector<int64_t> uneven_split(int64_t total, int64_t pieces) {
  std::vector<int64_t> sizes;
  int64_t used = 0;
  for (int64_t i = 0; i + 1 < pieces; ++i) {
    sizes.push_back(2 * static_cast<int64_t>(std::lround(total / static_cast<double>(pieces) * (i % 2 ? 0.85 : 1.15) / 2)));
    used += sizes.back();
  }
  sizes.push_back(total - used);
  return sizes;
}

// The data: smooth random fields (Gaussian blobs) and one explicit heat-equation step each,
// u + 0.2 * laplacian(u), zero outside the field. Same seed on every rank.
std::pair<at::Tensor, at::Tensor> heat_dataset() {
  at::manual_seed(7);
  const at::Tensor y = at::arange(kHeight, at::kDouble).view({kHeight, 1}), x = at::arange(kWidth, at::kDouble).view({1, kWidth});
  at::Tensor fields = at::zeros({kFields, 1, kHeight, kWidth});
  for (int64_t f = 0; f < kFields; ++f)
    for (int blob = 0; blob < 6; ++blob) {
      const double cy = at::rand({}).item<double>() * kHeight, cx = at::rand({}).item<double>() * kWidth;
      const double width = 8 + at::rand({}).item<double>() * 25, amplitude = at::randn({}).item<double>();
      fields[f][0] += amplitude * at::exp(-((y - cy).square() + (x - cx).square()) / (2 * width * width));
    }
  const at::Tensor laplacian = at::tensor({0., 1., 0., 1., -4., 1., 0., 1., 0.}).view({1, 1, 3, 3});
  const at::Tensor next = fields + 0.2 * at::conv2d(fields, laplacian, {}, 1, 1);
  return {fields, next};
}

// A U-Net with one level: conv, group norm, pool, conv, batch norm, upsample, skip, conv.
// Parameters are registered tensors, so the same class holds plain or ShardTensor ones.
struct UNet : torch::nn::Module {
  explicit UNet(const std::function<at::Tensor(at::Tensor)>& place) {
    at::manual_seed(11);
    auto conv = [&](const std::string& name, int64_t out, int64_t in, int64_t k) {
      const double bound = 1.0 / std::sqrt(static_cast<double>(in * k * k));
      parameter(name + "_weight", place((at::rand({out, in, k, k}) * 2 - 1) * bound));
      parameter(name + "_bias", place((at::rand({out}) * 2 - 1) * bound));
    };
    conv("enc1", 8, 1, 3);
    parameter("gn_weight", place(at::ones({8})));
    parameter("gn_bias", place(at::zeros({8})));
    conv("enc2", 16, 8, 3);
    parameter("bn_weight", place(at::ones({16})));
    parameter("bn_bias", place(at::zeros({16})));
    tensors_["bn_running_mean"] = register_buffer("bn_running_mean", place(at::zeros({16})));
    tensors_["bn_running_var"] = register_buffer("bn_running_var", place(at::ones({16})));
    conv("dec", 8, 24, 3);
    conv("head", 1, 8, 1);
  }

  const at::Tensor& p(const std::string& name) const { return tensors_.at(name); }

  void parameter(const std::string& name, at::Tensor t) { tensors_[name] = register_parameter(name, std::move(t)); }

  at::Tensor forward(const at::Tensor& u) {
    const at::Tensor e1 = at::gelu(at::group_norm(at::conv2d(u, p("enc1_weight"), p("enc1_bias"), 1, 1), 2, p("gn_weight"), p("gn_bias")));
    const at::Tensor down = at::max_pool2d(e1, {2, 2});
    const at::Tensor e2 = at::gelu(at::batch_norm(at::conv2d(down, p("enc2_weight"), p("enc2_bias"), 1, 1), p("bn_weight"),
                                                  p("bn_bias"), p("bn_running_mean"), p("bn_running_var"), is_training(), 0.1, 1e-5, false));
    const at::Tensor up = at::upsample_nearest2d(e2, {u.size(2), u.size(3)});
    const at::Tensor d = at::gelu(at::conv2d(at::cat({up, e1}, 1), p("dec_weight"), p("dec_bias"), 1, 1));
    return u + at::conv2d(d, p("head_weight"), p("head_bias"));  // learns the increment
  }

 private:
  std::map<std::string, at::Tensor> tensors_;  // the registered tensors (they share data with the module's), by name
};

// The field as an image, with the shard boundaries of `spec` drawn in white.
demo::Image field_image(const at::Tensor& field, const ShardTensorSpec& spec) {
  const at::Tensor f = field.to(at::kFloat).contiguous();
  const float lo = f.min().item<float>(), hi = f.max().item<float>();
  const int scale = 3;
  demo::Image img(static_cast<int>(kWidth) * scale, static_cast<int>(kHeight) * scale);
  auto a = f.accessor<float, 2>();
  for (int y = 0; y < img.height; ++y)
    for (int x = 0; x < img.width; ++x) {
      uint8_t r, g, b;
      demo::colour_map((a[y / scale][x / scale] - lo) / std::max(hi - lo, 1e-6f), &r, &g, &b);
      img.set(x, y, r, g, b);
    }
  for (const DimSharding& s : spec.shardings())
    for (size_t i = 1; i < s.offsets.size(); ++i) {
      const int at_px = static_cast<int>(s.offsets[i]) * scale;
      for (int w = -1; w <= 0; ++w) {
        if (s.tensor_dim == 2) img.line(0, at_px + w, img.width - 1, at_px + w, 255, 255, 255);
        if (s.tensor_dim == 3) img.line(at_px + w, 0, at_px + w, img.height - 1, 255, 255, 255);
      }
    }
  return img;
}

// Two loss curves (log scale): sharded in blue, single-process in orange dashes.
demo::Image loss_plot(const std::vector<double>& sharded, const std::vector<double>& single) {
  demo::Image img(640, 400);
  const int left = 50, right = 620, top = 20, bottom = 370;
  img.line(left, bottom, right, bottom, 0, 0, 0);
  img.line(left, top, left, bottom, 0, 0, 0);
  double lo = 1e300, hi = -1e300;
  for (const auto* v : {&sharded, &single})
    for (double l : *v) {
      lo = std::min(lo, std::log10(l));
      hi = std::max(hi, std::log10(l));
    }
  if (hi - lo < 1e-9) hi = lo + 1;
  auto point = [&](size_t i, double l, size_t n) {
    return std::make_pair(left + static_cast<int>((right - left) * i / std::max<size_t>(n - 1, 1)),
                          bottom - static_cast<int>((bottom - top) * (std::log10(l) - lo) / (hi - lo)));
  };
  for (int decade = static_cast<int>(std::ceil(lo)); decade <= hi; ++decade) {  // grid lines at powers of ten
    const int y = bottom - static_cast<int>((bottom - top) * (decade - lo) / (hi - lo));
    for (int x = left; x < right; x += 6) img.set(x, y, 180, 180, 180);
  }
  for (size_t i = 1; i < sharded.size(); ++i) {
    auto [x0, y0] = point(i - 1, sharded[i - 1], sharded.size());
    auto [x1, y1] = point(i, sharded[i], sharded.size());
    for (int w = 0; w < 2; ++w) img.line(x0, y0 + w, x1, y1 + w, 30, 80, 200);
  }
  for (size_t i = 1; i < single.size(); ++i)
    if (i % 2) {
      auto [x0, y0] = point(i - 1, single[i - 1], single.size());
      auto [x1, y1] = point(i, single[i], single.size());
      img.line(x0, y0 - 3, x1, y1 - 3, 240, 130, 20);
    }
  return img;
}

// libtorch keys an optimizer's state by the parameter's TensorImpl: as a string on 1.13, as a
// pointer on 2.x.
template <class Key>
Key optimizer_state_key(const at::Tensor& p) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream key;  // what libtorch 1.13's c10::guts::to_string writes
    key << p.unsafeGetTensorImpl();
    return key.str();
  } else {
    return p.unsafeGetTensorImpl();
  }
}

// Adam's state for parameter `p`, created as Adam's first step would create it.
torch::optim::AdamParamState& adam_state(torch::optim::Adam& optimizer, const at::Tensor& p) {
  auto& states = optimizer.state();
  auto& slot = states[optimizer_state_key<typename std::decay_t<decltype(states)>::key_type>(p)];
  if (!slot) {
    auto fresh = std::make_unique<torch::optim::AdamParamState>();
    fresh->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
    fresh->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
    slot = std::move(fresh);
  }
  return static_cast<torch::optim::AdamParamState&>(*slot);
}

// What a resumed run needs: parameters and buffers, Adam's moments and per-parameter step
// counts, and the training step. The tensors are the live ones (load fills them in place);
// the step counts are 0-d copies, read back by apply_step_counts.
checkpoint::StateDict training_state(UNet& model, torch::optim::Adam& optimizer, const at::Tensor& step) {
  checkpoint::StateDict state = {{"train.step", step}};
  for (const auto& item : model.named_parameters()) {
    torch::optim::AdamParamState& s = adam_state(optimizer, item.value());
    state["model." + item.key()] = item.value();
    state["adam." + item.key() + ".exp_avg"] = s.exp_avg();
    state["adam." + item.key() + ".exp_avg_sq"] = s.exp_avg_sq();
    state["adam." + item.key() + ".step"] = at::scalar_tensor(s.step(), at::kLong);
  }
  for (const auto& item : model.named_buffers()) state["model." + item.key()] = item.value();
  return state;
}

void apply_step_counts(UNet& model, torch::optim::Adam& optimizer, const checkpoint::StateDict& state) {
  for (const auto& item : model.named_parameters())
    adam_state(optimizer, item.value()).step(state.at("adam." + item.key() + ".step").item<int64_t>());
}

// The single-process copy takes the sharded model's resumed state (their values agree to
// ~1e-12 at any step, so this is the state the uninterrupted single-process run had).
void copy_state(UNet& from, torch::optim::Adam& from_opt, UNet& to, torch::optim::Adam& to_opt) {
  at::NoGradGuard no_grad;
  auto to_params = to.named_parameters();
  for (const auto& item : from.named_parameters()) {
    const at::Tensor& dst = to_params[item.key()];
    dst.copy_(full_tensor(item.value()));
    torch::optim::AdamParamState &s = adam_state(from_opt, item.value()), &d = adam_state(to_opt, dst);
    d.exp_avg().copy_(full_tensor(s.exp_avg()));
    d.exp_avg_sq().copy_(full_tensor(s.exp_avg_sq()));
    d.step(s.step());
  }
  auto to_buffers = to.named_buffers();
  for (const auto& item : from.named_buffers()) to_buffers[item.key()].copy_(full_tensor(item.value()));
}

}  // namespace

int main(int argc, char** argv) {
  const Options opt = parse(argc, argv);
  use_double_precision();
  const DeviceMesh mesh = DeviceMesh::create(opt.mesh_shape);
  const bool root = mesh.rank() == 0;

  // Layout: H over the first mesh dim, W over the second when there is one; uneven sizes.
  Placements field_layout;
  ShardSizes sizes;
  for (int64_t m = 0; m < mesh.ndim() && m < 2; ++m) {
    field_layout.push_back(Shard(2 + m));
    sizes.push_back({2 + m, uneven_split(m == 0 ? kHeight : kWidth, mesh.size(m))});
  }
  for (int64_t m = 2; m < mesh.ndim(); ++m) field_layout.push_back(Replicate());
  const Placements replicate(mesh.ndim(), Replicate());

  const auto [fields, targets] = heat_dataset();
  UNet sharded_model([&](const at::Tensor& t) { return distribute_tensor(t, mesh, replicate); });
  UNet single_model([](const at::Tensor& t) { return t.clone(); });
  torch::optim::Adam sharded_opt(sharded_model.parameters(), torch::optim::AdamOptions(3e-3));
  torch::optim::Adam single_opt(single_model.parameters(), torch::optim::AdamOptions(3e-3));

  if (root) {
    std::cout << "U-Net on a " << kHeight << " x " << kWidth << " heat field, batch " << kBatch << ", "
              << mesh.to_string() << "\n"
              << layout_table(ShardTensorSpec(mesh, field_layout, {kBatch, 1, kHeight, kWidth}, at::kDouble, sizes)) << "\n"
              << " step   sharded loss    single loss   rel. diff   ms/step  collectives\n";
  }
  std::vector<double> sharded_losses, single_losses;
  double worst = 0;
  at::Tensor last_prediction;
  int first_step = 0;
  if (!opt.resume_dir.empty()) {
    const at::Tensor saved_step = at::zeros({}, at::kLong);
    checkpoint::StateDict state = training_state(sharded_model, sharded_opt, saved_step);
    checkpoint::load(state, opt.resume_dir, {/*strict=*/true, mesh});
    apply_step_counts(sharded_model, sharded_opt, state);
    copy_state(sharded_model, sharded_opt, single_model, single_opt);
    first_step = static_cast<int>(saved_step.item<int64_t>());
    if (first_step >= opt.steps)
      throw std::invalid_argument("--resume " + opt.resume_dir + " continues after step " + std::to_string(first_step - 1) +
                                  ", so --steps must be more than " + std::to_string(first_step) + " (got " +
                                  std::to_string(opt.steps) + ")");
    if (root) std::cout << "resumed from " << opt.resume_dir << " after step " << first_step - 1 << "\n";
  }
  for (int step = first_step; step < opt.steps; ++step) {
    const int64_t first = (step * kBatch) % kFields;
    const at::Tensor u = fields.narrow(0, first, kBatch), target = targets.narrow(0, first, kBatch);
    double single_loss = 0;
    if (root) {
      single_opt.zero_grad();
      at::Tensor loss = at::mse_loss(single_model.forward(u), target);
      loss.backward();
      single_opt.step();
      single_loss = loss.item<double>();
    }
    const at::Tensor su = distribute_tensor(u, mesh, field_layout, sizes);
    const at::Tensor starget = distribute_tensor(target, mesh, field_layout, sizes);
    CommDebugMode comms;
    const auto t0 = std::chrono::steady_clock::now();
    sharded_opt.zero_grad();
    const at::Tensor prediction = sharded_model.forward(su);
    at::Tensor loss = at::mse_loss(prediction, starget);
    loss.backward();
    sharded_opt.step();
    const double sharded_loss = loss.item<double>();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    last_prediction = prediction.detach();
    if (root) {
      const double rel = std::abs(sharded_loss - single_loss) / std::abs(single_loss);
      worst = std::max(worst, rel);
      sharded_losses.push_back(sharded_loss);
      single_losses.push_back(single_loss);
      std::printf("%5d  %13.6e  %13.6e  %10.2e  %8.1f  %11lld\n", step, sharded_loss, single_loss, rel, ms,
                  static_cast<long long>(comms.total()));
      if (step == 0) std::cout << comms.table();
    }
    if (step + 1 == opt.save_after) {
      const at::Tensor steps_done = at::scalar_tensor(int64_t{step + 1}, at::kLong);
      checkpoint::save(training_state(sharded_model, sharded_opt, steps_done), opt.checkpoint_dir, {mesh});
      if (root) std::cout << "saved the training state after step " << step << " to " << opt.checkpoint_dir << "\n";
    }
  }

  const at::Tensor field = full_tensor(last_prediction).select(0, 0).select(0, 0);
  if (root) {
    std::filesystem::create_directories(opt.out_dir);
    const std::string field_png = opt.out_dir + "/predicted_field.png", loss_png = opt.out_dir + "/loss_curves.png";
    demo::write_png(field_image(field, spec(last_prediction)), field_png);
    demo::write_png(loss_plot(sharded_losses, single_losses), loss_png);
    std::cout << "largest relative loss difference over " << opt.steps << " steps: " << worst << "\n"
              << "wrote " << std::filesystem::absolute(field_png).string() << " (the predicted field, shard boundaries in white)\n"
              << "wrote " << std::filesystem::absolute(loss_png).string() << " (loss per step: sharded blue, single-process orange)\n";
  }
  return worst <= 1e-4 ? 0 : 1;
}
