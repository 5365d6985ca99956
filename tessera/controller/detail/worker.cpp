// A worker: runs its queue's commands in order on DTensor. Each value lives in a table by id;
// an op that throws leaves its output failed with the worker's message, and ops reading a failed
// value fail alike (without running), so the error surfaces at whatever the controller fetches.
#include <tessera/controller/detail/command.hpp>

#include <algorithm>
#include <functional>
#include <unordered_map>

#include <tessera/comm/communicator.hpp>
#include <tessera/controller/detail/wire.hpp>
#include <tessera/core/error.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/mesh/device_mesh.hpp>
#include <tessera/mpmd/detail/layout_wire.hpp>
#include <tessera/ops/random.hpp>
#include <tessera/runtime/runtime.hpp>

namespace tessera::controller::detail {

namespace {

using OpFn = std::function<DTensor(const std::vector<DTensor>&, const OpArgs&, const DeviceMesh&)>;

int64_t int_at(const OpArgs& args, size_t i, int64_t otherwise) { return i < args.ints.size() ? args.ints[i] : otherwise; }

std::vector<int64_t> dims_of(const OpArgs& args) {
  // ints: [keepdim, dims...]
  return std::vector<int64_t>(args.ints.begin() + (args.ints.empty() ? 0 : 1), args.ints.end());
}

// Monarch's mesh reduce: each worker's block is its own value along the mesh dims ints[2..]
// (Partial(op) there), combined onto every worker (Replicate) or, with scatter, split along
// dim 0 over them. ints: [op, scatter, mesh dims...].
DTensor mesh_reduce(const DTensor& x, const OpArgs& args, const DeviceMesh& mesh) {
  const auto op = static_cast<ReduceOp>(args.ints.at(0));
  const bool scatter = args.ints.at(1) != 0;
  const Layout& layout = x.layout();
  Placements partial = layout.placements(), reduced = layout.placements();
  for (size_t i = 2; i < args.ints.size(); ++i) {
    const auto d = static_cast<size_t>(args.ints[i]);
    TESSERA_CHECK(is_replicate(partial[d]), ShardingError, "reduce", "the tensor ", layout.to_string(),
                  " is not Replicate over mesh axis '", mesh.axis_names()[d],
                  "'; a mesh reduce takes each worker's whole block as its value");
    partial[d] = Partial{op};
    reduced[d] = scatter ? Placement(Shard{0}) : Placement(Replicate{});
  }
  const Layout as_partial(layout.global_shape(), layout.dtype(), layout.mesh(), partial, layout.shard_orders(),
                          layout.explicit_sizes());
  return DTensor(x.to_local(), mesh, as_partial).redistribute(mesh, reduced);
}

// The op table: every unary, binary and comparison op of DTensor's elementwise table, and the
// others by hand.
const std::unordered_map<std::string, OpFn>& op_table() {
  static const std::unordered_map<std::string, OpFn> table = [] {
    std::unordered_map<std::string, OpFn> t;
#define TESSERA_CONTROLLER_UNARY(name, ...) \
  t[#name] = [](const std::vector<DTensor>& in, const OpArgs&, const DeviceMesh&) { return tessera::name(in.at(0)); };
    TESSERA_UNARY_OPS(TESSERA_CONTROLLER_UNARY)
#undef TESSERA_CONTROLLER_UNARY
#define TESSERA_CONTROLLER_BINARY(name, ...)                                                                    \
  t[#name] = [](const std::vector<DTensor>& in, const OpArgs&, const DeviceMesh&) {                             \
    return tessera::name(in.at(0), in.at(1));                                                                   \
  };                                                                                                            \
  t[#name "_scalar"] = [](const std::vector<DTensor>& in, const OpArgs& a, const DeviceMesh&) {                 \
    return tessera::name(in.at(0), Scalar(a.scalars.at(0)));                                                    \
  };
    TESSERA_BINARY_OPS(TESSERA_CONTROLLER_BINARY)
    TESSERA_COMPARISON_OPS(TESSERA_CONTROLLER_BINARY)
#undef TESSERA_CONTROLLER_BINARY
    t["matmul"] = [](const std::vector<DTensor>& in, const OpArgs&, const DeviceMesh&) { return matmul(in.at(0), in.at(1)); };
    t["softmax"] = [](const std::vector<DTensor>& in, const OpArgs& a, const DeviceMesh&) {
      return softmax(in.at(0), a.ints.at(0));
    };
    t["sum"] = [](const std::vector<DTensor>& in, const OpArgs& a, const DeviceMesh&) {
      return sum(in.at(0), dims_of(a), int_at(a, 0, 0) != 0);
    };
    t["mean"] = [](const std::vector<DTensor>& in, const OpArgs& a, const DeviceMesh&) {
      return mean(in.at(0), dims_of(a), int_at(a, 0, 0) != 0);
    };
    t["transpose"] = [](const std::vector<DTensor>& in, const OpArgs& a, const DeviceMesh&) {
      return transpose(in.at(0), a.ints.at(0), a.ints.at(1));
    };
    t["reshape"] = [](const std::vector<DTensor>& in, const OpArgs& a, const DeviceMesh&) { return reshape(in.at(0), a.shape); };
    t["redistribute"] = [](const std::vector<DTensor>& in, const OpArgs& a, const DeviceMesh& mesh) {
      return in.at(0).redistribute(mesh, a.placements);
    };
    t["mesh_reduce"] = [](const std::vector<DTensor>& in, const OpArgs& a, const DeviceMesh& mesh) {
      return mesh_reduce(in.at(0), a, mesh);
    };
    t["zeros"] = [](const std::vector<DTensor>&, const OpArgs& a, const DeviceMesh& mesh) {
      return zeros(a.shape, mesh, a.placements, a.dtype);
    };
    t["ones"] = [](const std::vector<DTensor>&, const OpArgs& a, const DeviceMesh& mesh) {
      return ones(a.shape, mesh, a.placements, a.dtype);
    };
    t["full"] = [](const std::vector<DTensor>&, const OpArgs& a, const DeviceMesh& mesh) {
      return full(a.shape, a.scalars.at(0), mesh, a.placements, a.dtype);
    };
    t["randn"] = [](const std::vector<DTensor>&, const OpArgs& a, const DeviceMesh& mesh) {
      return randn(a.shape, mesh, a.placements, a.dtype);
    };
    t["rand"] = [](const std::vector<DTensor>&, const OpArgs& a, const DeviceMesh& mesh) {
      return rand(a.shape, mesh, a.placements, a.dtype);
    };
    return t;
  }();
  return table;
}

// A value, or why it failed.
struct Value {
  DTensor tensor;
  std::string error;
};

std::string worker_error(const std::string& what) { return "worker rank " + std::to_string(rank()) + ": " + what; }

// Why value `id` cannot be read ("" when it can): dropped, or failed (its error, passed on).
std::string unreadable(const std::unordered_map<uint64_t, Value>& values, uint64_t id, const std::string& call,
                       const char* what) {
  const auto it = values.find(id);
  if (it == values.end()) return worker_error("[" + call + "] " + what + " " + std::to_string(id) + " was dropped");
  return it->second.error;
}

// An op's inputs; on failure, why (a failed input fails the op alike).
std::string gather_inputs(const Command& c, const std::unordered_map<uint64_t, Value>& values, const std::string& call,
                          std::vector<DTensor>& inputs) {
  for (uint64_t id : c.inputs) {
    if (std::string error = unreadable(values, id, call, "input tensor"); !error.empty()) return error;
    inputs.push_back(values.at(id).tensor);
  }
  return {};
}

// A worker process's replies to the controller (world rank 0), sent without waiting and kept
// until they finish; null for in-process workers, which answer through the futures.
struct MpiReplies {
  std::vector<std::pair<Work, std::shared_ptr<void>>> inflight;

  void send(uint64_t request, const Reply& header, const Tensor* payload) {
    Communicator& comm = world();
    const int tag = reply_tag(request);
    auto words = std::make_shared<std::vector<int64_t>>(encode_reply(header));
    auto length = std::make_shared<std::vector<int64_t>>(1, static_cast<int64_t>(words->size()));
    inflight.emplace_back(comm.isend(length->data(), 1, DType::i64, 0, tag), length);
    inflight.emplace_back(comm.isend(words->data(), static_cast<int64_t>(words->size()), DType::i64, 0, tag), words);
    if (payload && payload->numel() > 0) {
      auto bytes = std::make_shared<Tensor>(payload->contiguous());
      inflight.emplace_back(comm.isend(bytes->raw_data(), bytes->numel(), bytes->dtype(), 0, tag), bytes);
    }
    const auto done = std::partition(inflight.begin(), inflight.end(), [](const auto& w) { return !w.first.is_completed(); });
    inflight.erase(done, inflight.end());
  }
};
thread_local MpiReplies* mpi_replies = nullptr;

void reply_error(const Command& c, const std::string& error) {
  if (c.reply) return c.reply->fail(error);
  if (c.request && mpi_replies) mpi_replies->send(c.request, Reply{false, error, true, DType::f32, {}, {}}, nullptr);
}

void reply_tensor(const Command& c, const Tensor& t) {
  if (c.reply) return c.reply->set(t);
  if (c.request && mpi_replies) mpi_replies->send(c.request, Reply{true, {}, true, t.dtype(), t.shape(), {}}, &t);
}

void reply_layout(const Command& c, const Layout& layout) {
  if (c.request && mpi_replies)
    mpi_replies->send(c.request, Reply{true, {}, false, DType::f32, {}, mpmd::detail::encode_layout(layout)}, nullptr);
}

// A remote function: the user's SPMD code on this worker's DTensors; its results become values.
void run_remote(const Command& c, std::unordered_map<uint64_t, Value>& values, const DeviceMesh& mesh) {
  std::vector<DTensor> inputs;
  std::string error = gather_inputs(c, values, "remote " + c.op, inputs);
  std::vector<DTensor> results;
  if (error.empty()) {
    try {
      results = (*find_remote(c.op))(mesh, inputs);
      if (results.size() != c.outputs.size())
        error = worker_error("[remote " + c.op + "] returned " + std::to_string(results.size()) + " tensors; the call expects " +
                             std::to_string(c.outputs.size()));
    } catch (const std::exception& e) {
      error = worker_error(e.what());
    }
  }
  const bool reporter = mesh.spec().ranks().front() == rank();
  for (size_t i = 0; i < c.outputs.size(); ++i) {
    Value& out = values[c.outputs[i]];
    if (error.empty()) out.tensor = results[i];
    else out.error = error;
    if (!reporter || i >= c.layouts.size()) continue;  // workers in other processes report when asked
    if (error.empty()) c.layouts[i]->set(results[i].layout());
    else c.layouts[i]->fail(error);
  }
}

}  // namespace

bool has_op(const std::string& name) { return op_table().count(name) > 0; }

std::vector<std::string> table_op_names() {
  std::vector<std::string> names;
  for (const auto& [name, fn] : op_table()) names.push_back(name);
  return names;
}

namespace {

// The value a fetch or a query reads, or null after replying why there is none.
const DTensor* readable(const Command& c, const std::unordered_map<uint64_t, Value>& values, const char* call) {
  if (std::string error = unreadable(values, c.output, call, "tensor"); !error.empty()) {
    reply_error(c, error);
    return nullptr;
  }
  return &values.at(c.output).tensor;
}

// Runs one command; false for stop.
bool execute(const Command& c, std::unordered_map<uint64_t, Value>& values,
             std::unordered_map<int64_t, DeviceMesh>& meshes) {
  {
    switch (c.kind) {
      case Command::Kind::stop:
        return false;
      case Command::Kind::make_mesh:
        meshes.emplace(c.mesh, DeviceMesh(c.mesh_shape, c.mesh_names,
                                          std::vector<int>(c.args.ints.begin(), c.args.ints.end())));
        break;
      case Command::Kind::query_layout:
        if (const DTensor* t = readable(c, values, "layout")) reply_layout(c, t->layout());
        break;
      case Command::Kind::slice_mesh:
        meshes.emplace(c.mesh, meshes.at(c.parent).slice(c.at));
        break;
      case Command::Kind::seed:
        tessera::manual_seed(static_cast<uint64_t>(c.args.ints.at(0)));
        break;
      case Command::Kind::drop:
        values.erase(c.output);
        break;
      case Command::Kind::run_op: {
        if (c.remote) {
          run_remote(c, values, meshes.at(c.mesh));
          break;
        }
        const DeviceMesh& mesh = meshes.at(c.mesh);
        const bool reporter = mesh.spec().ranks().front() == rank();
        Value& out = values[c.output];
        // A fresh value, unless the op reads its output too (in place): out= overwrites.
        if (std::find(c.inputs.begin(), c.inputs.end(), c.output) == c.inputs.end()) out = Value{};
        std::vector<DTensor> inputs;
        if (out.error.empty()) out.error = gather_inputs(c, values, c.op, inputs);
        if (out.error.empty()) {
          try {
            out.tensor = op_table().at(c.op)(inputs, c.args, mesh);
          } catch (const std::exception& e) {
            out.error = worker_error(e.what());
          }
        }
        if (c.target >= 0) {
          // Reduced onto a slice: its workers keep their (replicated) block on the slice's mesh,
          // the others nothing; the slice's first worker reports.
          const DeviceMesh& onto = meshes.at(c.target);
          if (out.error.empty() && onto.is_member()) {
            Placements kept;
            for (int64_t d = 0; d < mesh.ndim(); ++d)
              if (std::find(c.args.ints.begin() + 2, c.args.ints.end(), d) == c.args.ints.end())
                kept.push_back(out.tensor.placements()[static_cast<size_t>(d)]);
            FromLocalOptions global;
            global.shape = out.tensor.shape();
            out.tensor = DTensor::from_local(out.tensor.to_local(), onto, kept, global);
          }
          if (!onto.is_member()) values.erase(c.output);
          if (onto.spec().ranks().front() == rank() && c.layout) {
            if (out.error.empty()) c.layout->set(out.tensor.layout());
            else c.layout->fail(out.error);
          }
          break;
        }
        if (reporter && c.layout) {
          if (out.error.empty())
            c.layout->set(out.tensor.layout());
          else
            c.layout->fail(out.error);
        }
        break;
      }
      case Command::Kind::fetch_shard:
        if (const DTensor* t = readable(c, values, "fetch_shard")) reply_tensor(c, t->to_local().clone());
        break;
      case Command::Kind::fetch_full: {
        const DeviceMesh& mesh = meshes.at(c.mesh);
        std::string error = unreadable(values, c.output, "fetch_full", "tensor");
        Tensor whole;
        if (error.empty()) {
          try {
            whole = values.at(c.output).tensor.full_tensor();  // collective over the mesh
          } catch (const std::exception& e) {
            error = worker_error(e.what());
          }
        }
        if (mesh.spec().ranks().front() == rank()) {
          if (error.empty())
            reply_tensor(c, whole);
          else
            reply_error(c, error);
        }
        break;
      }
    }
  }
  return true;
}

}  // namespace

void mpi_worker_loop() {
  std::unordered_map<uint64_t, Value> values;
  std::unordered_map<int64_t, DeviceMesh> meshes;
  MpiReplies replies;
  mpi_replies = &replies;
  Communicator& comm = world();
  for (bool running = true; running;) {
    int64_t length = 0;
    wait_polling(comm.irecv(&length, 1, DType::i64, 0, kCommandLengthTag));
    std::vector<int64_t> words(static_cast<size_t>(length));
    comm.recv(words.data(), length, DType::i64, 0, kCommandTag);
    const Command command = decode_command(words);
    try {
      running = execute(command, values, meshes);
    } catch (const std::exception& e) {
      reply_error(command, worker_error(e.what()));
    }
  }
  // The controller receives every reply it asked for before stopping the workers.
  for (auto& [work, buffer] : replies.inflight) work.wait();
  mpi_replies = nullptr;
}

void worker_loop(CommandQueue& queue, Health& health) {
  std::unordered_map<uint64_t, Value> values;
  std::unordered_map<int64_t, DeviceMesh> meshes;
  for (;;) {
    const std::shared_ptr<const Command> command = queue.pop();
    try {
      if (!execute(*command, values, meshes)) return;
    } catch (const std::exception& e) {
      // Not an op's failure (those stay with its output): the worker's own state is broken, so
      // every future still waiting fails with this.
      health.fail(worker_error(e.what()));
      reply_error(*command, worker_error(e.what()));
    }
  }
}

}  // namespace tessera::controller::detail
