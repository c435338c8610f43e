// The operator sweep, in the spirit of PyTorch's OpInfo tests: every operator that has a
// sharding rule runs on random layouts of its inputs (Shard of any dim with torch.chunk or
// random uneven sizes, Replicate, Partial(sum)), on every mesh of this world size; the output
// must equal the single-device output (whole, and on the piece this rank owns), and the
// gradient of every differentiable input must equal the single-device gradient. The sweep
// then fails if any operator with a rule was never reached: the list of supported operators
// comes from the rule registry, not from this file.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/version.h>

#include <functional>
#include <set>

#include "dist/dist_fixture.h"
#include "dist/sweep_case.h"
#include "rules/registry.h"

using namespace shardtensor;
using namespace shardtensor::testing;

namespace shardtensor::testing {

at::Tensor call(const std::string& qualified, std::vector<c10::IValue> args) {
  const size_t dot = qualified.find('.');
  const std::string name = qualified.substr(0, dot), overload = dot == std::string::npos ? "" : qualified.substr(dot + 1);
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), overload.c_str());
  torch::jit::Stack stack = std::move(args);
  const auto& schema_args = op.schema().arguments();
  for (size_t i = stack.size(); i < schema_args.size(); ++i) {
    TORCH_CHECK(schema_args[i].default_value(), qualified, ": argument ", schema_args[i].name(), " has no default");
    stack.push_back(*schema_args[i].default_value());
  }
  op.callBoxed(&stack);
  return stack.front().toTensor();
}

at::Tensor unit(std::vector<int64_t> shape) { return at::rand(shape, at::kDouble) * 0.8 + 0.1; }  // in (0.1, 0.9)
at::Tensor normal(std::vector<int64_t> shape) { return at::randn(shape, at::kDouble); }

Case on(const std::string& label, std::function<Tensors()> make, std::function<at::Tensor(const Tensors&)> fn,
        std::vector<size_t> constants) {
  return {label, std::move(make), std::move(fn), std::move(constants)};
}

}  // namespace shardtensor::testing

namespace {

Case unary(const std::string& op, std::vector<c10::IValue> extra = {}, bool inplace = false) {
  return {op, [] { return Tensors{unit({5, 7})}; }, [op, extra, inplace](const Tensors& x) {
            std::vector<c10::IValue> args = {inplace ? x[0].clone() : x[0]};
            args.insert(args.end(), extra.begin(), extra.end());
            return call(op, args);
          }};
}

Case binary(const std::string& label, std::vector<int64_t> a, std::vector<int64_t> b,
            std::function<at::Tensor(const at::Tensor&, const at::Tensor&)> f) {
  return {label, [a, b] { return Tensors{unit(a), unit(b)}; }, [f](const Tensors& x) { return f(x[0], x[1]); }};
}

// A case for an elementwise operator built from its schema: every tensor argument (optional ones
// too) is a [5, 7] input, in the operator's domain (integers for the bitwise, shift, gcd and lcm
// operators; the second argument of the orthogonal polynomials a small integer degree; zeta's
// order above 1, acosh's argument above 1); Scalars 0.3 then 0.6 (3 then 2 for integers),
// ints 1, strings "floor". In-place
// overloads write into a copy. Values only: these operators' gradients are formulas of
// operators the sweep checks, and several have none.
Case elementwise_from_schema(const std::string& qualified) {
  const size_t dot = qualified.find('.');
  const auto op = c10::Dispatcher::singleton().findSchemaOrThrow(
      qualified.substr(0, dot).c_str(), dot == std::string::npos ? "" : qualified.substr(dot + 1).c_str());
  const std::string base = qualified.substr(6, dot == std::string::npos ? std::string::npos : dot - 6);
  const bool integers = base.find("bitwise") != std::string::npos || base.find("shift") != std::string::npos ||
                        base.find("xor") != std::string::npos || base == "gcd" || base == "gcd_" || base == "lcm" || base == "lcm_";
  const bool polynomial = base.find("polynomial") != std::string::npos;
  const bool inplace = !base.empty() && base.back() == '_' && base.rfind("__", 0) != 0;
  std::vector<const c10::Argument*> tensor_args, all_args;
  for (const c10::Argument& a : op.schema().arguments()) all_args.push_back(&a);
  size_t tensors = 0;
  for (const c10::Argument* a : all_args)
    if (a->type()->kind() == c10::TypeKind::TensorType ||
        (a->type()->kind() == c10::TypeKind::OptionalType && a->type()->containedType(0)->kind() == c10::TypeKind::TensorType))
      ++tensors;
  auto make = [=] {
    Tensors xs;
    for (size_t i = 0; i < tensors; ++i) {
      at::Tensor t = unit({5, 7});
      if (integers) t = (t * 20).round().to(at::kLong) + (i == 0 ? 1 : 0);
      else if (polynomial && i == 1) t = (t * 4).round();
      else if (base.find("zeta") != std::string::npos && i == 0) t = t + 1.5;
      else if (base.rfind("acosh", 0) == 0) t = t + 1.0;
      xs.push_back(t);
    }
    return xs;
  };
  auto fn = [=](const Tensors& x) {
    std::vector<c10::IValue> args;
    size_t next = 0, scalars = 0;
    for (const c10::Argument* a : all_args) {
      const c10::TypeKind kind = a->type()->kind();
      const c10::TypeKind inner = kind == c10::TypeKind::OptionalType ? a->type()->containedType(0)->kind() : kind;
      if (inner == c10::TypeKind::TensorType) {
        at::Tensor t = x[next++];
        args.push_back(inplace && next == 1 ? t.clone() : t);
      } else if (inner == c10::TypeKind::NumberType) {  // optional ones too: clip's bounds
        const bool first = scalars++ == 0;
        args.push_back(integers ? c10::Scalar(first ? 3 : 2) : c10::Scalar(first ? 0.3 : 0.6));
      } else if (a->default_value()) {
        args.push_back(*a->default_value());
      } else if (inner == c10::TypeKind::IntType) {
        args.push_back(int64_t{1});
      } else if (inner == c10::TypeKind::StringType) {
        args.push_back(std::string("floor"));
      } else {
        TORCH_CHECK(false, qualified, ": the sweep has no value for argument ", a->name(), " of type ", a->type()->str());
      }
    }
    return call(qualified, args).to(at::kDouble);
  };
  std::vector<size_t> constants(tensors);
  for (size_t i = 0; i < tensors; ++i) constants[i] = i;
  return on(qualified + " (from its schema)", make, fn, constants);
}

// Every operator whose schema takes a Scalar, with the Scalar an int, a bool and a float: Python
// passes an int Scalar where the user wrote an int (torch.histc(x, bins=4, min=0, max=12)), so no
// rule or kernel may read a Scalar argument as a double.
std::vector<Case> scalar_kind_cases() {
  using Values = std::vector<c10::IValue>;
  const std::vector<std::pair<std::string, std::function<Values(double, double)>>> kinds = {
      {"int", [](double a, double b) { return Values{static_cast<int64_t>(a), static_cast<int64_t>(b)}; }},
      {"bool", [](double a, double b) { return Values{a != 0, b != 0}; }},
      {"float", [](double a, double b) { return Values{a, b}; }},
  };
  std::vector<Case> cases;
  for (const auto& [kind, scalars] : kinds) {
    const std::string tag = " (" + kind + " Scalars)";
    const Values low_high = scalars(0, 1), two = scalars(2, 1);
    cases.push_back(on("histc" + tag, [] { return Tensors{unit({5, 6}) * 3 - 1}; },
                       [low_high](const Tensors& x) { return call("aten::histc", {x[0], int64_t{4}, low_high[0], low_high[1]}); },
                       /*constants=*/{0}));
    const bool arithmetic = kind != "bool";  // torch refuses to subtract a bool or scale by one, on one process too
    cases.push_back(on("pointwise with Scalars" + tag, [] { return Tensors{unit({5, 7})}; }, [low_high, two, arithmetic](const Tensors& x) {
      const at::Tensor& v = x[0];
      const at::Tensor differences =
          arithmetic ? call("aten::sub.Scalar", {v, two[1], two[0]}) + call("aten::rsub.Scalar", {v, two[0]}) : v * 0;
      return call("aten::add.Scalar", {v, two[0], arithmetic ? two[1] : c10::IValue(int64_t{1})}) + differences +
             call("aten::mul.Scalar", {v, two[0]}) + call("aten::div.Scalar", {v, two[1]}) +
             call("aten::pow.Tensor_Scalar", {v, two[0]}) + call("aten::clamp", {v, low_high[0], low_high[1]}) +
             call("aten::clamp_min", {v, low_high[0]}) + call("aten::clamp_max", {v, low_high[1]}) +
             call("aten::threshold", {v, low_high[0], two[0]}) + call("aten::hardtanh", {v, low_high[0], low_high[1]}) +
             call("aten::leaky_relu", {v, low_high[1]}) + call("aten::elu", {v, low_high[1]}) +
             call("aten::masked_fill.Scalar", {v, v > 0.5, two[0]}) + call("aten::eq.Scalar", {v, low_high[1]}).to(at::kDouble) +
             call("aten::remainder.Scalar", {v * 5, two[0]}) + call("aten::fmod.Scalar", {v * 5, two[0]}) +
             call("aten::lerp.Scalar", {v, v * v, low_high[1]}) + call("aten::addcmul", {v, v, v, two[0]}) +
             call("aten::fill_.Scalar", {v.clone(), two[0]});
    }));
    if (kind == "bool" && TORCH_VERSION_MAJOR < 2) {
      // libtorch 1.13's norm kernels refuse a bool order on one process too ("expects norm to
      // be integer or float"): there is no single-device value to compare with.
      std::cout << "op sweep: no norms with bool Scalar orders on libtorch " << TORCH_VERSION_MAJOR << "." << TORCH_VERSION_MINOR
                << " (its norm kernels refuse a bool order on one process)" << std::endl;
      continue;
    }
    cases.push_back(on("norms with Scalar orders" + tag, [] { return Tensors{normal({4, 5})}; }, [two](const Tensors& x) {
      return call("aten::linalg_vector_norm", {x[0], two[0], std::vector<int64_t>{1}}) +
             call("aten::norm.ScalarOpt_dim", {x[0], two[0], std::vector<int64_t>{1}}) + call("aten::dist", {x[0], x[0] * x[0], two[0]});
    }));
  }
  return cases;
}

// Operators that read some dims whole and keep the others' shards (order statistics, rolls,
// triangles, index writes, pools and samplers without a halo geometry), called by name: several
// are missing from older libtorch.
std::vector<Case> whole_dim_cases() {
  std::vector<Case> cases;
#if TORCH_VERSION_MAJOR >= 2
  using L = std::vector<int64_t>;
  cases.push_back(on("median/mode/kthvalue along a dim", [] { return Tensors{normal({5, 7})}; }, [](const Tensors& x) {
    auto values = [](const std::string& op, std::vector<c10::IValue> args) { return call(op, std::move(args)); };
    return values("aten::median.dim", {x[0], int64_t{1}}) + values("aten::nanmedian.dim", {x[0], int64_t{1}}) +
           values("aten::mode", {x[0], int64_t{1}}) + values("aten::kthvalue", {x[0], int64_t{3}, int64_t{1}}) +
           call("aten::median", {x[0]}) + call("aten::nanmedian", {x[0]});
  }));
  cases.push_back(on("var_mean/any.dims", [] { return Tensors{normal({5, 7})}; }, [](const Tensors& x) {
    auto vm = at::var_mean(x[0], at::IntArrayRef{0}, /*correction=*/1, /*keepdim=*/false);
    const at::Tensor any = call("aten::any.dims", {x[0] > 0.5, L{0}, true}).to(at::kDouble);
    return std::get<0>(vm) + std::get<1>(vm) * 2 + any;
  }));
  cases.push_back(on("cumsum_/cumprod_/roll", [] { return Tensors{unit({5, 7})}; }, [](const Tensors& x) {
    return call("aten::cumsum_", {x[0].clone(), int64_t{1}}) + call("aten::cumprod_", {x[0].clone(), int64_t{0}}) +
           call("aten::roll", {x[0], L{2}, L{1}}) + call("aten::roll", {x[0], L{1, -3}, L{0, 1}}) +
           call("aten::roll", {x[0], L{4}, L{}});
  }));
  cases.push_back(on("_safe_softmax", [] { return Tensors{normal({5, 7})}; },
                     [](const Tensors& x) { return call("aten::_safe_softmax", {x[0], int64_t{1}}); }));
  cases.push_back(on("copying views", [] { return Tensors{normal({5, 7}), normal({1, 7})}; }, [](const Tensors& x) {
    const std::vector<at::Tensor> pieces = at::split_with_sizes_copy(x[0], L{2, 4, 1}, 1);
    return call("aten::view_copy", {x[0], L{7, 5}}).t() + call("aten::expand_copy", {x[1], L{5, 7}}) +
           at::cat(pieces, 1) + call("aten::diagonal_copy", {x[0]}).sum();
  }));
  cases.push_back(on("tril/triu", [] { return Tensors{normal({3, 5, 4})}; }, [](const Tensors& x) {
    return at::tril(x[0], 1) + at::triu(x[0], -1) + x[0].clone().tril_(-2) + x[0].clone().triu_(2);
  }));
  cases.push_back(on("cholesky_inverse", [] {
    return Tensors{at::tril(normal({3, 4, 4})) + at::eye(4, at::kDouble) * 3};
  }, [](const Tensors& x) { return at::cholesky_inverse(x[0]); }));
  cases.push_back(on("geqrf/ldl_factor", [] {
    const at::Tensor a = normal({3, 4, 4});
    return Tensors{a + a.transpose(-1, -2) + at::eye(4, at::kDouble) * 5};
  }, [](const Tensors& x) {
    const auto qr = at::geqrf(x[0]);
    const auto ldl = at::linalg_ldl_factor_ex(x[0]);
    return std::get<0>(qr).sum(-1) + std::get<1>(qr) + std::get<0>(ldl).sum(-1) + std::get<1>(ldl).to(at::kDouble);
  }, {0}));
  cases.push_back(on("index_fill/index_reduce", [] {
    return Tensors{normal({5, 7}), at::tensor(L{0, 3, 5}), normal({5, 3}), at::tensor(L{4, 1, 1})};
  }, [](const Tensors& x) {
    return x[0].index_fill(1, x[1], 2.5) + x[0].clone().index_fill_(1, x[1], at::scalar_tensor(1.5, at::kDouble)) +
           x[0].index_fill(1, x[1], at::scalar_tensor(0.5, at::kDouble)) + x[0].clone().index_fill_(0, x[3], -1.0) +
           x[0].index_reduce(1, x[1], x[2], "amax") + x[0].clone().index_reduce_(1, x[1], x[2], "mean", false);
  }, {0, 2}));
  cases.push_back(on("bucketize", [] { return Tensors{normal({5, 7}), at::linspace(-1, 1, 6, at::kDouble)}; },
                     [](const Tensors& x) { return at::bucketize(x[0], x[1]).to(at::kDouble); }));
  cases.push_back(on("adaptive/fractional max pooling, unpooling", [] {
    const at::Tensor x = normal({2, 3, 8, 6});
    const auto pooled = at::max_pool2d_with_indices(x, {2, 2});
    return Tensors{x, at::rand({2, 3, 2}, at::kDouble), std::get<0>(pooled), std::get<1>(pooled)};
  }, [](const Tensors& x) {
    const at::Tensor adaptive = std::get<0>(at::adaptive_max_pool2d(x[0], {3, 2}));
    const at::Tensor fractional = std::get<0>(at::fractional_max_pool2d(x[0], {2, 2}, {3, 2}, x[1]));
    return adaptive + fractional + at::max_unpool2d(x[2], x[3], {8, 6}).sum({2, 3}, true);
  }, {0, 1, 2, 3}));
  cases.push_back(on("3-d adaptive/fractional max pooling, unpooling", [] {
    const at::Tensor x = normal({2, 2, 4, 6, 4});
    const auto pooled = at::max_pool3d_with_indices(x, {2, 2, 2});
    return Tensors{x, at::rand({2, 2, 3}, at::kDouble), std::get<0>(pooled), std::get<1>(pooled)};
  }, [](const Tensors& x) {
    const at::Tensor adaptive = std::get<0>(at::adaptive_max_pool3d(x[0], {2, 3, 2}));
    const at::Tensor fractional = std::get<0>(at::fractional_max_pool3d(x[0], {2, 2, 2}, {2, 3, 2}, x[1]));
    return adaptive + fractional + at::max_unpool3d(x[2], x[3], {4, 6, 4}, {2, 2, 2}, {0, 0, 0}).sum({2, 3, 4}, true);
  }, {0, 1, 2, 3}));
  cases.push_back(on("grid_sampler_2d", [] { return Tensors{normal({3, 2, 5, 6}), at::rand({3, 4, 3, 2}, at::kDouble) * 2 - 1}; },
                     [](const Tensors& x) { return at::grid_sampler_2d(x[0], x[1], 0, 0, false); }));
  cases.push_back(on("grid_sampler_3d", [] { return Tensors{normal({3, 2, 4, 5, 3}), at::rand({3, 2, 3, 2, 3}, at::kDouble) * 2 - 1}; },
                     [](const Tensors& x) { return at::grid_sampler_3d(x[0], x[1], 0, 0, true); }));
  cases.push_back(on("anti-aliased resampling", [] { return Tensors{normal({2, 3, 8, 6})}; }, [](const Tensors& x) {
    return call("aten::_upsample_bilinear2d_aa", {x[0], L{5, 4}, false}) + call("aten::_upsample_bicubic2d_aa", {x[0], L{5, 4}, true}) +
           call("aten::_upsample_lanczos2d_aa", {x[0], L{5, 4}, false});
  }, {0}));
#endif
  return cases;
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (const std::string& name : more_elementwise_op_names()) cases.push_back(elementwise_from_schema(name));
  for (Case& c : whole_dim_cases()) cases.push_back(std::move(c));
  for (const char* name : {"abs", "neg", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan",
                           "asin", "acos", "atan", "sinh", "cosh", "tanh", "sigmoid", "relu", "sqrt", "rsqrt",
                           "reciprocal", "sign", "floor", "ceil", "round", "trunc", "frac", "erf", "erfc", "silu", "mish",
                           "hardsigmoid", "hardswish"}) {
    cases.push_back(unary(std::string("aten::") + name));
    cases.push_back(unary(std::string("aten::") + name + "_", {}, /*inplace=*/true));
  }
  cases.push_back(on("logical_not/bitwise_not", [] { return Tensors{unit({5, 7})}; }, [](const Tensors& x) {
    at::Tensor b = x[0] > 0.5;
    return at::logical_not(b).logical_or(b.clone().logical_not_()).logical_and(b.bitwise_not()).bitwise_not_()
        .logical_and_(b).logical_or_(b.logical_not()).to(at::kDouble);
  }));
  for (const char* name : {"aten::gelu", "aten::leaky_relu", "aten::elu", "aten::hardtanh", "aten::softplus",
                           "aten::nan_to_num", "aten::isnan"})
    cases.push_back(unary(name));
  for (const char* name : {"aten::gelu_", "aten::leaky_relu_", "aten::elu_", "aten::hardtanh_", "aten::nan_to_num_"})
    cases.push_back(unary(name, {}, true));
  cases.push_back(unary("aten::threshold", {0.5, 0.0}));
  cases.push_back(unary("aten::threshold_", {0.5, 0.0}, true));
  cases.push_back(unary("aten::clamp", {0.3, 0.6}));
  cases.push_back(unary("aten::clamp_", {0.3, 0.6}, true));
  for (const char* name : {"aten::clamp_min", "aten::clamp_max"}) cases.push_back(unary(name, {0.4}));
  for (const char* name : {"aten::clamp_min_", "aten::clamp_max_"}) cases.push_back(unary(name, {0.4}, true));
  cases.push_back(unary("aten::pow.Tensor_Scalar", {2.5}));
  cases.push_back(unary("aten::pow_.Scalar", {2.5}, true));
  for (const char* name : {"aten::add.Scalar", "aten::sub.Scalar", "aten::rsub.Scalar", "aten::mul.Scalar", "aten::div.Scalar"})
    cases.push_back(unary(name, {1.5}));
  for (const char* name : {"aten::add_.Scalar", "aten::sub_.Scalar", "aten::mul_.Scalar", "aten::div_.Scalar"})
    cases.push_back(unary(name, {1.5}, true));
  for (const char* name : {"aten::eq.Scalar", "aten::ne.Scalar", "aten::lt.Scalar", "aten::le.Scalar", "aten::gt.Scalar", "aten::ge.Scalar"})
    cases.push_back(on(name, [] { return Tensors{(unit({5, 7}) * 4).round()}; },
                       [name](const Tensors& x) { return call(name, {x[0], 2.0}).to(at::kDouble); }));
  cases.push_back(unary("aten::clone"));
  cases.push_back(on("_to_copy", [] { return Tensors{unit({5, 7})}; }, [](const Tensors& x) { return x[0].to(at::kFloat).to(at::kDouble); }));
  cases.push_back(on("masked_fill", [] { return Tensors{unit({5, 7}), unit({7})}; }, [](const Tensors& x) {
    const at::Tensor mask = x[1] > 0.5;  // broadcast over rows
    return x[0].masked_fill(mask, 2.0) + x[0].clone().masked_fill_(mask, -1.0) +
           x[0].masked_fill(mask, at::scalar_tensor(3.0, at::kDouble)) + x[0].clone().masked_fill_(mask, at::scalar_tensor(4.0, at::kDouble));
  }));

  // Binary with broadcasting: full shapes, a missing leading dim, a size-1 dim.
  using F = std::function<at::Tensor(const at::Tensor&, const at::Tensor&)>;
  const std::vector<std::pair<std::string, F>> binaries = {
      {"add", [](auto& a, auto& b) { return at::add(a, b, 0.5); }},
      {"sub", [](auto& a, auto& b) { return at::sub(a, b); }},
      {"mul", [](auto& a, auto& b) { return a * b; }},
      {"div", [](auto& a, auto& b) { return a / b; }},
      {"add_/sub_/mul_/div_", [](auto& a, auto& b) { return a.clone().add_(b).sub_(b, 0.5).mul_(b).div_(b); }},
      {"pow", [](auto& a, auto& b) { return at::pow(a, b); }},
      {"maximum/minimum", [](auto& a, auto& b) { return at::maximum(a, b) - at::minimum(a, b) * 2; }},
      {"rsub", [](auto& a, auto& b) { return at::rsub(a, b); }},
      {"div floor", [](auto& a, auto& b) { return at::div(a * 10, b, "floor"); }},
      {"comparisons", [](auto& a, auto& b) {
         return (at::eq(a, b).to(at::kDouble) + at::ne(a, b) * 2 + at::lt(a, b) * 3 + at::le(a, b) * 4 + at::gt(a, b) * 5 + at::ge(a, b) * 6) * a;
       }},
      {"where", [](auto& a, auto& b) { return at::where(a > b, a, b * 2); }},
      {"addcmul/addcdiv", [](auto& a, auto& b) {
         return at::addcmul(a, a, b, 0.5) + at::addcdiv(a, a, b, 2) + a.clone().addcmul_(a, b) + a.clone().addcdiv_(a, b);
       }},
      {"lerp", [](auto& a, auto& b) { return at::lerp(a, b, 0.3) + a.clone().lerp_(b, 0.7); }},
      {"copy_", [](auto& a, auto& b) { return at::zeros_like(a).copy_(b) * a; }},
      {"remainder/fmod", [](auto& a, auto& b) {
         return at::remainder(a * 5, b) + at::fmod(a * 5, b) + (a * 5).remainder_(b) + (a * 5).fmod_(b) + at::remainder(a, 0.3) +
                at::fmod(a, 0.3) + (a * 1).remainder_(0.3) + (a * 1).fmod_(0.3);
       }},
  };
  for (const auto& entry : binaries) {
    cases.push_back(binary(entry.first + " [5,7]x[5,7]", {5, 7}, {5, 7}, entry.second));
    cases.push_back(binary(entry.first + " [5,7]x[7]", {5, 7}, {7}, entry.second));
    cases.push_back(binary(entry.first + " [5,7]x[5,1]", {5, 7}, {5, 1}, entry.second));
  }
  cases.push_back(on("activation backward", [] { return Tensors{normal({5, 7})}; }, [](const Tensors& x) {
    const at::Tensor& v = x[0];
    return at::relu(v) + at::sigmoid(v) + at::tanh(v) + at::gelu(v) + at::silu(v) + at::leaky_relu(v, 0.1) +
           at::hardtanh(v, -0.5, 0.5) + at::elu(v);
  }));
  cases.push_back(on("sgn/silu_backward", [] { return Tensors{normal({5, 7}), normal({5, 7})}; }, [](const Tensors& x) {
    return at::sgn(x[0]) * x[1] + x[0].clone().sgn_();
  }, /*constants=*/{0}));  // sgn's gradient is libtorch's plain _efficientzerotensor
  cases.push_back(on("like factories and fills", [] { return Tensors{normal({5, 7})}; }, [](const Tensors& x) {
    const at::Tensor& v = x[0];
    return at::zeros_like(v) + at::ones_like(v) * v + at::full_like(v, 3.0) + at::empty_like(v).fill_(2.0) +
           v.clone().zero_() + v.clone().fill_(at::scalar_tensor(5.0, at::kDouble));
  }));

  // Reductions, over each dim and all, keepdim both ways.
  for (int64_t dim : {0, 1, 2})
    for (bool keepdim : {false, true}) {
      const std::string tag = " dim " + std::to_string(dim) + (keepdim ? " keepdim" : "");
      auto make = [] { return Tensors{normal({4, 5, 3})}; };
      cases.push_back(on("sum/mean/prod/amax/amin" + tag, make, [=](const Tensors& x) {
        const at::Tensor& v = x[0];
        return v.sum({dim}, keepdim) + v.mean({dim}, keepdim) + v.prod(dim, keepdim) + v.amax({dim}, keepdim) + v.amin({dim}, keepdim);
      }));
      cases.push_back(on("max/min/argmax/argmin" + tag, make, [=](const Tensors& x) {
        const at::Tensor& v = x[0];
        return std::get<0>(v.max(dim, keepdim)) + std::get<1>(v.min(dim, keepdim)) + std::get<1>(v.max(dim, keepdim)) +
               v.argmax(dim, keepdim) + v.argmin(dim, keepdim) + std::get<0>(v.min(dim, keepdim));
      }));
      cases.push_back(on("var/std/norm/logsumexp/all/any" + tag, make, [=](const Tensors& x) {
        const at::Tensor& v = x[0];
        return v.var({dim}, /*unbiased=*/true, keepdim) + v.std({dim}, false, keepdim) + v.norm(2, {dim}, keepdim) +
               at::linalg_vector_norm(v, 3, {dim}, keepdim) + v.logsumexp({dim}, keepdim) + (v > 0).all(dim, keepdim) +
               (v > 0).any(dim, keepdim);
      }));
      // Norms are pending norms of the local norms (NormPartial); +-inf over an empty shard gathers.
      cases.push_back(on("norm overloads / orders" + tag, make, [=](const Tensors& x) {
        const at::Tensor& v = x[0];
        return at::norm(v, 1.5, {dim}, keepdim, at::kDouble) + at::linalg_vector_norm(v, INFINITY, {dim}, keepdim) +
               at::linalg_vector_norm(v, -INFINITY, {dim}, keepdim) + at::linalg_vector_norm(v, 0, {dim}, keepdim) +
               at::linalg_vector_norm(v, -2, {dim}, keepdim) + v.norm(1, {dim}, keepdim);
      }));
    }
  cases.push_back(on("full reductions", [] { return Tensors{normal({4, 5})}; }, [](const Tensors& x) {
    const at::Tensor& v = x[0];
    return v.sum() + v.mean() + (v * 0.5).prod() + v.max() + v.min() + (v > -5).all() + (v > 2).any() + v.sum(at::IntArrayRef{0, 1}, true).squeeze() +
           v.norm() + v.norm(3) + at::norm(v, 1, at::kDouble) + at::linalg_vector_norm(v, INFINITY) + at::dist(v, v * v, 3);
  }));

  // Matrix products.
  cases.push_back(on("mm", [] { return Tensors{normal({5, 6}), normal({6, 7})}; }, [](const Tensors& x) { return at::mm(x[0], x[1]); }));
  cases.push_back(on("bmm", [] { return Tensors{normal({3, 5, 6}), normal({3, 6, 4})}; }, [](const Tensors& x) { return at::bmm(x[0], x[1]); }));
  cases.push_back(on("mv", [] { return Tensors{normal({5, 6}), normal({6})}; }, [](const Tensors& x) { return at::mv(x[0], x[1]); }));
  cases.push_back(on("dot", [] { return Tensors{normal({7}), normal({7})}; }, [](const Tensors& x) { return at::dot(x[0], x[1]); }));
  cases.push_back(on("addmm", [] { return Tensors{normal({7}), normal({5, 6}), normal({6, 7})}; },
                     [](const Tensors& x) { return at::addmm(x[0], x[1], x[2], 0.5, 2); }));
  cases.push_back(on("baddbmm", [] { return Tensors{normal({3, 5, 4}), normal({3, 5, 6}), normal({3, 6, 4})}; },
                     [](const Tensors& x) { return at::baddbmm(x[0], x[1], x[2], 0.5, 2); }));
  // 2-D linear outside autograd is one operator with its own rule (with autograd it is t + addmm).
  cases.push_back(on("linear 2d without autograd", [] { return Tensors{normal({5, 6}), normal({7, 6}), normal({7})}; },
                     [](const Tensors& x) {
                       at::NoGradGuard no_grad;
                       return at::linear(x[0], x[1], x[2]) + at::linear(x[0], x[1]);
                     }));
  cases.push_back(on("matmul 3d x 2d / linear", [] { return Tensors{normal({3, 4, 6}), normal({5, 6}), normal({5})}; },
                     [](const Tensors& x) { return at::linear(x[0], x[1], x[2]) + at::matmul(x[0], x[1].t()); }));

  // Views and shape ops.
  cases.push_back(on("view/reshape", [] { return Tensors{normal({4, 6, 2})}; }, [](const Tensors& x) {
    const at::Tensor& v = x[0];
    return v.view({24, 2}).view({4, 12}).reshape({2, 2, 6, 2}).reshape({-1}).view({4, 6, 2}) + v.reshape({4, 3, 4}).view({4, 6, 2});
  }));
  // reshape of a contiguous tensor lowers to _reshape_alias on 1.13 but to view on 2.x, so the
  // rule for _reshape_alias is reached directly, on both lines.
  cases.push_back(on("_reshape_alias", [] { return Tensors{normal({4, 6, 2})}; }, [](const Tensors& x) {
    return at::_reshape_alias(x[0], {24, 2}, {2, 1}).view({4, 6, 2}) * 3;
  }));
  cases.push_back(on("permute/transpose/t", [] { return Tensors{normal({3, 4, 5})}; }, [](const Tensors& x) {
    const at::Tensor& v = x[0];
    return v.permute({2, 0, 1}).transpose(0, 2).transpose(0, 1).contiguous() * 2 + v.select(2, 1).t().t().unsqueeze(2);
  }));
  cases.push_back(on("squeeze/unsqueeze/expand", [] { return Tensors{normal({4, 1, 5})}; }, [](const Tensors& x) {
    const at::Tensor& v = x[0];
    return v.squeeze().unsqueeze(1) + v.squeeze(1).unsqueeze(0).expand({3, 4, 5}).sum(0).unsqueeze(1) + v.expand({4, 6, 5}).sum(1, true);
  }));
  // Bitwise and logical combinations of masks (nn.init.trunc_normal_ reaches bitwise_or), erfinv.
  cases.push_back(on("bitwise/logical_xor/erfinv", [] { return Tensors{normal({5, 4}), normal({5, 4})}; }, [](const Tensors& x) {
    const at::Tensor a = x[0] > 0, b = x[1] > 0.5;
    at::Tensor c = a.clone();
    c.bitwise_or_(b).bitwise_and_(a).bitwise_xor_(b).logical_xor_(a);
    at::Tensor e = (x[0] * 0.3).clamp(-0.9, 0.9);  // clamp's backward reads its input, not the result erfinv_ overwrites
    e.erfinv_();
    const at::Tensor masks = a.bitwise_or(b).to(at::kDouble) + a.bitwise_and(b) * 2 + a.bitwise_xor(b) * 3 + a.logical_xor(b) + c;
    return masks * x[0] + (x[1] * 0.3).tanh().erfinv() + e;
  }));
  // Views that read some dims whole (diagonal's two, unfold's one) keep the others' pieces.
  cases.push_back(on("diagonal/unfold", [] { return Tensors{normal({5, 4, 4})}; }, [](const Tensors& x) {
    const at::Tensor& m = x[0];
    return m.diagonal(0, 1, 2).t() * 2 + m.unfold(2, 2, 1).sum({2, 3}).t() + m.diagonal(1, 0, 2).sum(1, true) +
           m.diagonal(-1, -1, 1).t().sum(0);
  }));
  // as_strided addresses the whole tensor's memory: it runs on the whole tensor. Its backward
  // (a scatter into fresh zeros) is not swept: the input is a constant.
  cases.push_back(on("as_strided", [] { return Tensors{normal({6, 4}), normal({3, 3})}; },
                     [](const Tensors& x) { return x[0].as_strided({3, 3}, {4, 1}, 2) * x[1] + x[0].as_strided({3, 3}, {1, 4}); },
                     /*constants=*/{0}));
#if TORCH_VERSION_MAJOR >= 2
  cases.push_back(on("squeeze.dims", [] { return Tensors{normal({4, 1, 5, 1})}; }, [](const Tensors& x) {
    return x[0].squeeze(at::IntArrayRef{1, 3}) * 3 + x[0].squeeze(at::IntArrayRef{0, -1}).sum(0);
  }));
#endif
  cases.push_back(on("select/slice/narrow/index_select", [] { return Tensors{normal({5, 6}), at::tensor({4, 0, 2}, at::kLong)}; },
                     [](const Tensors& x) {
                       const at::Tensor& v = x[0];
                       return v.select(1, 2).unsqueeze(1) * v.slice(1, 1, 5, 2).sum(1, true) + v.narrow(0, 1, 3).sum() +
                              v.index_select(0, x[1]).sum(0) + v.index_select(1, x[1]).sum(1, true);
                     }));
  cases.push_back(on("split/chunk/unbind", [] { return Tensors{normal({5, 6})}; }, [](const Tensors& x) {
    const at::Tensor& v = x[0];
    auto parts = v.split(2, 1);
    auto sized = v.split_with_sizes({1, 4}, 0);
    auto rows = v.unbind(1);
    // Every piece is used: libtorch 1.13 fills the gradient of an unused piece with plain zeros.
    auto chunks = v.chunk(3, 1);
    return parts[0] * parts[2] + parts[1] + sized[1].sum(0, true).narrow(1, 0, 2).expand({5, 2}) + sized[0].narrow(1, 0, 2) +
           at::stack(rows, 1).narrow(1, 0, 2) + chunks[0] + chunks[1] * chunks[2];
  }));
  cases.push_back(on("cat/stack", [] { return Tensors{normal({5, 3}), normal({5, 4}), normal({2, 3})}; }, [](const Tensors& x) {
    return at::cat({x[0], x[1]}, 1).sum(1, true) + at::stack({x[0], x[0]}, 0).sum(0) + x[0].new_zeros({5, 3}) +
           x[0].new_ones({3}) + x[0].new_full({5, 1}, 2.0) + x[0].new_empty({5, 3}).fill_(1.0) + x[0].new_empty_strided({5, 3}, {3, 1}).fill_(2.0) + at::cat({x[0], x[2]}, 0).sum(0) + at::stack({x[0], x[0] * 2}, 1).sum(1);
  }));
  cases.push_back(on("detach/alias", [] { return Tensors{normal({5, 3})}; }, [](const Tensors& x) {
    return x[0] * x[0].detach() + at::alias(x[0]);
  }));

  // Normalisation, losses, embedding.
  for (int64_t dim : {0, 1})
    cases.push_back(on("softmax/log_softmax dim " + std::to_string(dim), [] { return Tensors{normal({5, 6})}; },
                       [dim](const Tensors& x) { return at::softmax(x[0], dim) * 3 + at::log_softmax(x[0], dim); }));
  // One dim read whole: scans, sort and topk (gathered first only when that dim is sharded).
  for (int64_t dim : {0, 1}) {
    const std::string d = " dim " + std::to_string(dim);
    cases.push_back(on("cumsum/cumprod/logcumsumexp" + d, [] { return Tensors{unit({5, 6})}; }, [dim](const Tensors& x) {
      return at::cumsum(x[0], dim) + at::cumprod(x[0] + 0.5, dim) + at::logcumsumexp(x[0], dim);
    }));
    // libtorch's cummax/cummin backward (cummaxmin_backward) builds plain zeros of the input's
    // sizes inside autograd, which cannot meet ShardTensors (as index_put's): values only.
    cases.push_back(on("cummax/cummin" + d, [] { return Tensors{normal({5, 6})}; }, [dim](const Tensors& x) {
      return std::get<0>(at::cummax(x[0], dim)) * 2 + std::get<0>(at::cummin(x[0], dim)) +
             std::get<1>(at::cummax(x[0], dim)).to(at::kDouble);
    }, /*constants=*/{0}));
    cases.push_back(on("sort/topk" + d, [] { return Tensors{normal({5, 6})}; }, [dim](const Tensors& x) {
      const auto [values, indices] = at::sort(x[0], /*stable=*/true, dim, /*descending=*/true);
      const auto [top, top_indices] = at::topk(x[0], 3, dim);
      return values * 2 + indices.to(at::kDouble) + (top * top).sum(dim, true) + top_indices.sum(dim, true).to(at::kDouble) +
             std::get<0>(at::sort(x[0], dim)).flip(dim);
    }));
  }
  cases.push_back(on("histc with a range", [] { return Tensors{unit({5, 6})}; },
                     [](const Tensors& x) { return at::histc(x[0], 7, 0.0, 1.0); }, /*constants=*/{0}));
  for (Case& c : scalar_kind_cases()) cases.push_back(std::move(c));
  cases.push_back(on("layer_norm", [] { return Tensors{normal({3, 4, 6}), normal({6}), normal({6})}; },
                     [](const Tensors& x) { return at::layer_norm(x[0], {6}, x[1], x[2]) + at::layer_norm(x[0], {4, 6}); }));
  for (int64_t reduction : {0, 1, 2})
    cases.push_back(on("mse_loss reduction " + std::to_string(reduction), [] { return Tensors{normal({5, 6}), normal({5, 6})}; },
                       [reduction](const Tensors& x) { return at::mse_loss(x[0], x[1], reduction); }));
  for (int64_t reduction : {0, 1, 2}) {
    cases.push_back(on("cross_entropy reduction " + std::to_string(reduction),
                       [] { return Tensors{normal({7, 4}), at::randint(0, 4, {7}, at::kLong), unit({4})}; },
                       [reduction](const Tensors& x) {
                         return at::cross_entropy_loss(x[0], x[1], {}, reduction) + at::nll_loss(at::log_softmax(x[0], 1), x[1], x[2], reduction, 2);
                       },
                       /*constants=*/{2}));
    cases.push_back(on("cross_entropy 2d reduction " + std::to_string(reduction),
                       [] { return Tensors{normal({2, 3, 4, 5}), at::randint(0, 3, {2, 4, 5}, at::kLong)}; },
                       [reduction](const Tensors& x) { return at::cross_entropy_loss(x[0], x[1], {}, reduction); }));
  }
  cases.push_back(on("embedding", [] { return Tensors{normal({6, 4}), at::randint(0, 6, {3, 5}, at::kLong)}; },
                     [](const Tensors& x) { return at::embedding(x[0], x[1]); }));
  // Indexing along a dim with global indices (a smaller index along another dim, too).
  auto indexing_inputs = [] {
    return Tensors{normal({5, 6}), normal({5, 6}), at::randint(0, 5, {5, 6}, at::kLong), at::randint(0, 5, {4, 6}, at::kLong)};
  };
  cases.push_back(on("gather/scatter/scatter_add/scatter_reduce", indexing_inputs, [](const Tensors& x) {
    const at::Tensor &v = x[0], &src = x[1], &rows = x[2], &short_rows = x[3];
    return at::gather(v, 0, rows) + at::gather(v, 1, rows.remainder(6)) + at::gather(v, 0, short_rows).sum(0, true) +
           at::scatter(v, 0, rows, src) + v.clone().scatter_(1, rows.remainder(6), 2.5) + at::scatter_add(v, 0, rows, src) +
           v.clone().scatter_add_(0, rows, src) + at::scatter_reduce(v, 0, rows, src, "amax") +
           v.clone().scatter_reduce_(0, rows, src, "sum", false) + at::scatter(v, 1, rows.remainder(6), 0.5) +
           v.clone().scatter_(0, rows, src);
  }));
  auto advanced_inputs = [] {
    return Tensors{normal({5, 6, 4}), normal({3, 6, 4}), at::tensor({4, 0, 2}, at::kLong), at::tensor({1, 5, 1}, at::kLong)};
  };
  cases.push_back(on("advanced indexing / index_put accumulate", advanced_inputs, [](const Tensors& x) {
    const at::Tensor &v = x[0], &rows = x[2], &cols = x[3];
    const at::Tensor none;
    const at::Tensor picked = at::index(v, {rows});                           // [3, 6, 4]
    const at::Tensor pairs = at::index(v, {rows, cols});                      // [3, 4]
    const at::Tensor inner = at::index(v, {none, cols, rows.remainder(4)});  // adjacent, after a kept dim: [5, 3]
    const at::Tensor apart = at::index(v, {rows, none, cols.remainder(4)});  // not adjacent: broadcast dims first, [3, 6]
    return picked + pairs.unsqueeze(1) + inner.narrow(0, 0, 3).sum(1, true).unsqueeze(2) + apart.unsqueeze(2) +
           v.clone().index_put_({rows}, x[1], true).narrow(0, 1, 3) + at::index_put(v, {rows, cols}, pairs * 2, true).narrow(0, 2, 3);
  }));
  // Overwriting index_put: libtorch 1.13's backward builds plain zeros of the values' shape,
  // which cannot meet ShardTensors (as split_backward's), so values only.
  cases.push_back(on("index_put overwrite", advanced_inputs, [](const Tensors& x) {
    const at::Tensor &v = x[0], &rows = x[2], &cols = x[3];
    return at::index_put(v, {rows}, x[1]).narrow(0, 0, 3) + v.clone().index_put_({at::Tensor(), cols}, at::scalar_tensor(1.5, at::kDouble)).narrow(0, 0, 3) +
           [&] {
             at::Tensor target = v.clone();
             return at::_index_put_impl_(target, {rows}, x[1], false, true).narrow(0, 1, 3);
           }();
  }, /*constants=*/{0, 1}));
  // libtorch 1.13 has no derivative for scatter with a reduce argument: values only.
  cases.push_back(on("scatter with reduce", indexing_inputs, [](const Tensors& x) {
    const at::Tensor &v = x[0], &src = x[1], &rows = x[2];
    return at::scatter(v, 0, rows, src, "multiply") + v.clone().scatter_(0, rows, 1.5, "add") + v.clone().scatter_(0, rows, src, "add") +
           at::scatter(v, 0, rows, 0.5, "multiply");
  }, /*constants=*/{0, 1}));
  // Random ops with parameters that make them deterministic (random_test.cpp checks the draws).
  cases.push_back(on("uniform_/normal_/bernoulli_/dropout (degenerate)", [] { return Tensors{normal({5, 7})}; }, [](const Tensors& x) {
    const at::Tensor& v = x[0];
    return at::empty_like(v).uniform_(2.0, 2.0) * v + at::empty_like(v).normal_(3.0, 0.0) + at::empty_like(v).bernoulli_(1.0) * v +
           std::get<0>(at::native_dropout(v, 0.0, true)) * 2 + std::get<0>(at::native_dropout(v, 0.5, false));
  }));
  cases.push_back(on("log_normal_/cauchy_/geometric_/exponential_/random_ (degenerate)", [] { return Tensors{normal({5, 7})}; },
                     [](const Tensors& x) {
    const at::Tensor& v = x[0];
    // Parameters at the edge of what torch accepts (p < 1, std > 0): a value other than the
    // limit has a chance of 1e-12 or less per element.
    return at::empty_like(v).log_normal_(0.5, 1e-30) * v + at::empty_like(v).cauchy_(-1.0, 1e-30) +
           at::empty_like(v).geometric_(1 - 1e-12) * v +
           at::empty_like(v).exponential_(1e30) + at::empty_like(v).random_(3, 4) * v + at::empty_like(v).random_(1) +
           at::empty_like(v).random_() * 0;
  }));
  cases.push_back(on("bernoulli/multinomial/*_like (degenerate)", [] {
    // x[1]: all the weight on category 3 of every row, so that no draw can differ.
    at::Tensor one_hot = at::zeros({5, 7}, at::kDouble);
    one_hot.select(1, 3).fill_(1);
    return Tensors{normal({5, 7}), one_hot};
  }, [](const Tensors& x) {
    const at::Tensor &v = x[0], &one_hot = x[1];
    const at::Tensor certain = (v > 0).to(v.scalar_type());  // probabilities of 0 and 1 only
    const at::Tensor rows = at::multinomial(one_hot, 4, true).to(v.scalar_type()) + at::multinomial(one_hot, 1).to(v.scalar_type());
    return at::bernoulli(certain) * v + at::bernoulli(v.detach(), 1.0) + at::empty_like(v).bernoulli_(certain) +
           at::rand_like(v) * 0 + at::randn_like(v) * 0 + at::randint_like(v.detach(), 2, 3) * v + at::randint_like(v.detach(), 1) +
           rows.sum(1, /*keepdim=*/true);
  }, /*constants=*/{1}));
  // Batched matrix functions: batch shards kept, matrix dims gathered. Values only: their
  // backward formulas are not covered on ShardTensors yet. Well-conditioned SPD matrices, so
  // every factorisation is unique and real.
#if TORCH_VERSION_MAJOR >= 2
  cases.push_back(on("linalg (batch-sharded)", [] {
    const at::Tensor m = normal({3, 4, 4});
    return Tensors{at::matmul(m, m.transpose(1, 2)) + 4 * at::eye(4, at::kDouble)};
  }, [](const Tensors& x) {
    const at::Tensor& a = x[0];
    const at::Tensor vectors = at::linalg_svdvals(a) + std::get<0>(at::linalg_eigh(a)) + at::real(std::get<0>(at::linalg_eig(a))) +
                               at::real(at::linalg_eigvals(a));
    const at::Tensor scalars = at::linalg_det(a) + std::get<1>(at::linalg_slogdet(a));
    return std::get<1>(at::linalg_qr(a)) + at::linalg_inv(a) + at::linalg_cholesky(a) + std::get<0>(at::linalg_lu_factor(a)) +
           at::linalg_matrix_exp(a * 0.1) + std::get<2>(at::linalg_lu(a)) + vectors.unsqueeze(-1) + scalars.view({3, 1, 1});
  }, /*constants=*/{0}));
#else
  // libtorch 1.13's composite linalg functions write into plain tensors they allocate.
  std::cout << "op sweep: no batched linalg case on libtorch 1.13 (its composite linalg functions copy into "
               "plain tensors they allocate); torch 2.x runs it" << std::endl;
#endif
  // Views that reinterpret the element type; the dtype round trips are values only.
  cases.push_back(on("view_as_complex/view_as_real/view.dtype", [] { return Tensors{normal({5, 6, 2}), normal({5, 6, 2})}; },
                     [](const Tensors& x) {
    const at::Tensor c = at::view_as_complex(x[0]);
    const at::Tensor bits = x[1].detach();
    const at::Tensor conjugates = c.conj() * 2 + at::conj_physical(c) + c.clone().conj_physical_() + at::_neg_view(c) * 3;
    return at::view_as_real(c * c + c + conjugates) + bits.view(at::kLong).view(at::kDouble) +
           bits.view(at::kFloat).view(at::kDouble) + bits.view(at::kDouble);
  }));
  // Whole-tensor comparisons answer the same bool on every rank: x[1] is x[0]'s copy, laid out
  // otherwise.
  cases.push_back(on("equal/is_same_size", [] {
    const at::Tensor v = normal({5, 6});
    return Tensors{v, v.clone(), normal({5, 6})};
  }, [](const Tensors& x) {
    const double answers = (at::equal(x[0], x[1]) ? 1 : 0) + (at::equal(x[0], x[2]) ? 2 : 0) +
                           (at::equal(x[0], x[0].narrow(0, 0, 2)) ? 4 : 0) + (at::is_same_size(x[0], x[2]) ? 8 : 0) +
                           (x[0].is_same_size(x[0].sum(0)) ? 16 : 0);
    return x[0] * answers;
  }));
  // out= overloads run as their functional overload (out_variant.h): out= tensors of the
  // result's shape keep their layout, empty ones take the result's. Values only: out= does not
  // differentiate.
  cases.push_back(on("out= variants", [] { return Tensors{normal({5, 7}), normal({5, 7}), normal({7, 4})}; }, [](const Tensors& x) {
    const at::Tensor &a = x[0], &b = x[1], &m = x[2];
    at::Tensor same = at::empty_like(a), product = a.new_empty({0}), sums = at::empty_like(a).sum(1, true);
    at::Tensor values = a.new_empty({0}), indices = a.new_empty({0}, a.options().dtype(at::kLong)), joined = a.new_empty({0});
    at::add_out(same, a, b, 2.0);
    at::mm_out(product, a, m);
    at::sum_out(sums, a, {1}, /*keepdim=*/true);
    at::max_out(values, indices, b, 1, /*keepdim=*/true);
    at::cat_out(joined, {a, b}, 1);
    at::Tensor clamped = at::empty_like(b);
    at::clamp_out(clamped, b, -0.5, 0.5);
    return same + product.sum(1, true) + sums + values + indices.to(at::kDouble) + joined.narrow(1, 3, 7) + clamped;
  }, /*constants=*/{0, 1, 2}));
  for (Case& c : spatial_cases()) cases.push_back(std::move(c));
  for (Case& c : attention_cases()) cases.push_back(std::move(c));
  for (Case& c : attention_operator_cases()) cases.push_back(std::move(c));
  return cases;
}

// A random layout of `global` on `mesh`: per mesh dim Shard(any dim), Replicate, or (floating
// inputs) Partial(sum); sharded dims get torch.chunk or random uneven sizes.
at::Tensor distribute_randomly(const at::Tensor& global, const DeviceMesh& mesh, std::mt19937& rng, std::string& trace) {
  Placements ps;
  for (int64_t m = 0; m < mesh.ndim(); ++m) {
    const int r = static_cast<int>(rng() % 10);
    if (global.dim() > 0 && r < 6) {
      ps.push_back(Shard(static_cast<int64_t>(rng() % global.dim())));
    } else if (r == 9 && global.is_floating_point()) {
      ps.push_back(Partial());
    } else {
      ps.push_back(Replicate());
    }
  }
  ShardSizes sizes;
  if (rng() % 2) {
    for (int64_t d = 0; d < global.dim(); ++d) {
      int64_t pieces = 1;
      for (int64_t m = 0; m < mesh.ndim(); ++m)
        if (ps[m].is_shard(d)) pieces *= mesh.size(m);
      if (pieces > 1) sizes.push_back({d, random_sizes(rng, global.size(d), pieces)});
    }
  }
  // Every rank drew the same global tensor (run_case seeds them alike), so each cuts its own box
  // and no byte moves (src_data_rank=None): the sweep checks operators, and distribute_tensor's
  // scatter and agreement check have tests of their own (redistribute_test.cpp).
  at::Tensor t = distribute_tensor(global, mesh, ps, sizes, /*src_data_rank=*/std::nullopt);
  trace += " " + spec(t).to_string();
  return t;
}

void expect_close(const at::Tensor& actual, const at::Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  const at::Tensor a = actual.to(at::kDouble), e = expected.to(at::kDouble);
  EXPECT_TRUE(at::allclose(a, e, 1e-7, 1e-9, /*equal_nan=*/true)) << what << "\nmax difference " << (a - e).abs().max().item<double>();
}

// `sharded` equals the single-device `expected`: each rank compares the piece it owns with the
// same slice of `expected`, and the pieces together cover the whole tensor; a pending Partial,
// whose pieces are terms of a sum, is compared whole (full_tensor). Gathering every result onto
// every rank cost a collective per comparison: on CI's two cores, most of the sweep's time.
void expect_matches(const at::Tensor& sharded, const at::Tensor& expected, const std::string& what) {
  const ShardTensorSpec& s = spec(sharded);
  if (s.has_partial()) return expect_close(full_tensor(sharded), expected, what);
  ASSERT_EQ(s.shape(), expected.sizes().vec()) << what;
  at::Tensor piece = expected;
  const auto offsets = s.local_offsets(), shape = s.local_shape();
  for (int64_t d = 0; d < piece.dim(); ++d) piece = piece.narrow(d, offsets[d], shape[d]);
  expect_close(to_local(sharded).detach(), piece, what + ", the piece this rank owns");
}

void run_case(const Case& c, const DeviceMesh& mesh, std::mt19937& rng, int trial) {
  at::manual_seed(1000 + trial);
  const Tensors globals = c.make();
  std::string trace = c.label + " on " + mesh.to_string() + " trial " + std::to_string(trial) + ":";
  Tensors refs, sharded;
  for (size_t i = 0; i < globals.size(); ++i) {
    const at::Tensor& g = globals[i];
    const bool grad = g.is_floating_point() && std::count(c.constants.begin(), c.constants.end(), i) == 0;
    refs.push_back(g.clone().requires_grad_(grad));
    at::Tensor s = distribute_randomly(g, mesh, rng, trace);
    if (grad) s.set_requires_grad(true);
    sharded.push_back(s);
  }
  SCOPED_TRACE(trace);
  const at::Tensor expected = c.fn(refs);
  const at::Tensor out = c.fn(sharded);
  ASSERT_TRUE(is_shard_tensor(out)) << "the result is not a ShardTensor";
  expect_matches(out, expected.detach(), "forward");
  const ShardTensorSpec& s = spec(out);
  if (!expected.requires_grad()) return;
  at::manual_seed(2000 + trial);  // the same cotangent on every rank, whatever the case drew before
  const at::Tensor w = at::randn(expected.sizes(), at::kDouble);
  (expected * w).sum().backward();
  if (trial % 2 == 0) {
    (full_tensor(out) * w).sum().backward();
  } else {
    // A Partial(sum) cotangent, sharded like the output (#16 item 6): every backward formula
    // must resolve it, or keep it pending correctly, on its way to the inputs.
    Placements ps = s.placements();
    for (Placement& p : ps)
      if (!p.is_shard()) p = Partial(ReduceOp::Sum);
    out.backward(distribute_tensor(w.to(out.scalar_type()), mesh, ps, s.shard_sizes()));
  }
  for (size_t i = 0; i < refs.size(); ++i) {
    if (!refs[i].grad().defined()) continue;
    ASSERT_TRUE(sharded[i].grad().defined()) << "input " << i << " got no gradient";
    expect_matches(sharded[i].grad(), refs[i].grad(), "gradient of input " + std::to_string(i));
    // The gradient is laid out like its input (#16 item 6): sharded where the input is, with its
    // sizes, never gathered onto every rank; where the input is Replicate it may be a pending
    // Partial (dispatch/relayout.h). (A Partial input's gradient is the adjoint of a reduction,
    // a broadcast: not compared.)
    const ShardTensorSpec& in = spec(sharded[i]);
    const ShardTensorSpec& g = spec(sharded[i].grad());
    if (!in.has_partial()) {
      bool alike = true;
      for (size_t m = 0; m < in.placements().size(); ++m)
        alike = alike && (in.placements()[m].is_shard() ? g.placements()[m] == in.placements()[m] : !g.placements()[m].is_shard());
      EXPECT_TRUE(alike) << "gradient of input " << i << " is laid out " << g.to_string() << ", its input " << in.to_string();
      if (alike) EXPECT_EQ(g.shard_sizes(), in.shard_sizes()) << "gradient of input " << i << " has other shard sizes";
    }
  }
}

}  // namespace

TEST(OpSweep, EveryRuledOperatorGivesTheSingleDeviceValuesAndGradients) {
  const std::vector<Case> cases = all_cases();
  const int trials = std::getenv("SHARDTENSOR_SWEEP_TRIALS") ? std::atoi(std::getenv("SHARDTENSOR_SWEEP_TRIALS")) : 3;
  const char* seed_env = std::getenv("SHARDTENSOR_SWEEP_SEED");  // another seed explores other layouts
  const uint32_t seed = seed_env ? static_cast<uint32_t>(std::stoul(seed_env)) : 4242;
  std::cout << "op sweep: seed " << seed << ", " << cases.size() << " cases x " << trials << " layouts x "
            << test_meshes().size() << " meshes" << std::endl;
  std::mt19937 rng(seed);
  const std::vector<std::string> fell_back_before = fallback_operators();  // other tests' deliberate fallbacks
  const char* only = std::getenv("SHARDTENSOR_SWEEP_ONLY");  // a label substring, to replay one case
  for (const DeviceMesh& mesh : test_meshes())
    for (const Case& c : cases)
      for (int trial = 0; trial < trials && (!only || c.label.find(only) != std::string::npos); ++trial) {
        try {
          run_case(c, mesh, rng, trial);
        } catch (const c10::Error& e) {
          ADD_FAILURE() << c.label << " on " << mesh.to_string() << " trial " << trial << ": " << e.what_without_backtrace();
        } catch (const std::exception& e) {
          ADD_FAILURE() << c.label << " on " << mesh.to_string() << " trial " << trial << ": " << e.what();
        }
      }

  const std::vector<std::string> reached = propagated_operators();
  const std::set<std::string> seen(reached.begin(), reached.end());
  std::vector<std::string> missing;
  if (only) {  // a replay reaches only its own operators: the coverage check reads the whole sweep
    std::cout << "op sweep: coverage of every ruled operator not checked: SHARDTENSOR_SWEEP_ONLY=" << only
              << " runs only the cases whose label contains it" << std::endl;
  }
  for (const std::string& name : only ? std::vector<std::string>{} : sharding_rule_names()) {
    // A rule for an operator this libtorch lacks (SDPA's on 1.13), or decomposes before it
    // reaches a backend (bernoulli.p on 1.13), cannot be reached.
    const size_t dot = name.find('.');
    const auto op = c10::Dispatcher::singleton().findSchema({name.substr(0, dot), dot == std::string::npos ? "" : name.substr(dot + 1)});
    bool reachable = op && !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd);
#if TORCH_VERSION_MAJOR < 2
    reachable = reachable && name.find("linalg_") == std::string::npos;  // no linalg case on 1.13 (said above)
#endif
    if (reachable && !seen.count(name)) missing.push_back(name);
  }
  EXPECT_TRUE(missing.empty()) << "operators with a sharding rule but no sweep case reaching it: " << ::testing::PrintToString(missing);
  std::vector<std::string> fell_back;
  for (const std::string& name : fallback_operators())
    if (std::find(fell_back_before.begin(), fell_back_before.end(), name) == fell_back_before.end()) fell_back.push_back(name);
  EXPECT_TRUE(fell_back.empty()) << "operators that fell back during the sweep: " << ::testing::PrintToString(fell_back);
}
