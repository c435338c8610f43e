// Dispatch policy and debug tools for Python: strict mode, implicit replication, the
// collective counter, and the translation of C++ errors into Python exceptions.
#include <c10/util/Exception.h>

#include <memory>
#include <optional>

#include "bindings.h"
#include "comm/comm_debug.h"
#include "shardtensor/dispatch.h"
#include "shardtensor/sharding_rule.h"
#include "shardtensor/log.h"

namespace shardtensor::python {
namespace {

// A scope object for `with`: the C++ RAII guard lives between __enter__ and __exit__.
template <typename Guard>
struct Scope {
  std::unique_ptr<Guard> guard;
  void enter() {
    TORCH_CHECK(!guard, "this scope is already active; `with` it once at a time.");
    guard = std::make_unique<Guard>();
  }
  void exit() { guard.reset(); }
};

// CommDebugMode keeps its counts after the `with` block ends, as DTensor's does: the C++
// counter is read into plain maps when the scope closes.
struct CommCounter : Scope<CommDebugMode> {
  std::map<std::string, int64_t> counts;
  std::map<std::string, std::map<std::string, int64_t>> by_operator;
  int64_t total = 0;
  int64_t bytes = 0;
  std::string table;

  void snapshot() {
    if (!guard) return;
    auto lock = comm_debug_lock();  // a prefetching thread may be recording into it
    counts = guard->counts();
    by_operator = guard->counts_by_operator();
    total = guard->total();
    bytes = guard->bytes();
    table = guard->table();
  }
  void stop() {
    snapshot();
    exit();
  }
};

// C++ errors keep their message (without the C++ backtrace) and become the Python exception
// of their kind, on every rank where the C++ layer raises.
void translate_errors() {
  py::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const c10::ValueError& e) {
      PyErr_SetString(PyExc_ValueError, e.what_without_backtrace());
    } catch (const c10::TypeError& e) {
      PyErr_SetString(PyExc_TypeError, e.what_without_backtrace());
    } catch (const c10::IndexError& e) {
      PyErr_SetString(PyExc_IndexError, e.what_without_backtrace());
    } catch (const c10::NotImplementedError& e) {
      PyErr_SetString(PyExc_NotImplementedError, e.what_without_backtrace());
    } catch (const c10::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
    }
  });
}

}  // namespace

void bind_dispatch(py::module_& m) {
  translate_errors();
  m.def("set_strict", &set_strict, py::arg("strict"));
  m.def("is_strict", &is_strict);
  m.def("fallback_operators", &fallback_operators);
  m.def("propagated_operators", &propagated_operators);
  m.def("sharding_rule_names", &sharding_rule_names);  // every operator with a rule ("aten::add.Tensor")
  // Without the GIL: dropping the last reference to a Gloo backend joins its worker threads,
  // and a worker may need the GIL to release a Python tensor its last collective kept.
  m.def("release_cached_layouts", &release_cached_layouts, py::call_guard<py::gil_scoped_release>());
  // The Python logger as the C++ log's sink and filter; None restores stderr (at exit, before
  // the interpreter that the functions need goes away).
  m.def(
      "set_log_sink",
      [](std::optional<py::function> sink, std::optional<py::function> wants) {
        if (!sink) return set_log_sink({}, {});
        auto* write = new py::function(std::move(*sink));  // leaked: see rule_bindings.cpp
        auto* ask = new py::function(std::move(*wants));
        set_log_sink(
            [write](LogLevel level, const std::string& line) {
              py::gil_scoped_acquire gil;
              try {
                (*write)(static_cast<int>(level), line);
              } catch (py::error_already_set& e) {  // a failing handler must not fail the operator
                e.discard_as_unraisable("shardtensor log sink");
              }
            },
            [ask](LogLevel level) {
              py::gil_scoped_acquire gil;
              try {
                return (*ask)(static_cast<int>(level)).cast<bool>();
              } catch (py::error_already_set& e) {
                e.discard_as_unraisable("shardtensor log filter");
                return false;
              }
            });
      },
      py::arg("sink"), py::arg("wants"));

  m.def("set_implicit_replication", &set_implicit_replication, py::arg("enabled"));
  m.def("is_implicit_replication", &is_implicit_replication);
  m.def("hand_on_gradient_terms", &hand_on_gradient_terms, py::arg("leaf"), py::arg("ranks"));
  using Replication = Scope<ImplicitReplication>;
  py::class_<Replication>(m, "ImplicitReplication")
      .def(py::init<>())
      .def("enter", &Replication::enter)
      .def("exit", &Replication::exit);

  py::class_<CommCounter>(m, "CommCounter")
      .def(py::init<>())
      .def("start", &CommCounter::enter)
      .def("stop", &CommCounter::stop)
      .def("snapshot", &CommCounter::snapshot)
      .def_readonly("counts", &CommCounter::counts)
      .def_readonly("by_operator", &CommCounter::by_operator)
      .def_readonly("total", &CommCounter::total)
      .def_readonly("bytes", &CommCounter::bytes)
      .def_readonly("table", &CommCounter::table);
  // fully_shard's prefetch thread counts its all-gathers into the mode of the thread that
  // started them (python/shardtensor/fsdp/_prefetch.py).
  py::class_<CommDebugHandoff>(m, "CommDebugHandoff")
      .def(py::init<>())
      .def("enter", &CommDebugHandoff::enter)
      .def("exit", &CommDebugHandoff::exit);
}

}  // namespace shardtensor::python
