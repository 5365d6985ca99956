// Workers as MPI processes (world ranks 1..n; the controller is rank 0): a command travels as its
// words (wire.hpp), a reply is received when its future is read, and every reply still owed is
// received before the workers are stopped (a worker cannot end with a reply unsent).
#include <algorithm>
#include <chrono>
#include <functional>
#include <thread>
#include <type_traits>

#include <tessera/comm/communicator.hpp>
#include <tessera/comm/word_messages.hpp>
#include <tessera/controller/detail/transport.hpp>
#include <tessera/controller/detail/wire.hpp>
#include <tessera/mesh/device_mesh.hpp>
#include <tessera/runtime/runtime.hpp>
#include <tessera/sharding/layout_words.hpp>

namespace tessera::controller::detail {

namespace {

// Waits for `work` by polling, without the communication timeout: the controller waits for a
// reply as long as the workers take.
void wait_polling(const Work& work) {
  auto pause = std::chrono::microseconds(5);
  while (!work.is_completed()) {
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
  work.wait();  // rethrows a failure
}

class MpiTransport final : public Transport {
 public:
  int first_worker() const override { return 1; }

  void send(const std::vector<int>& ranks, std::shared_ptr<const Command> command) override {
    auto words = std::make_shared<const std::vector<int64_t>>(encode_command(*command));
    Communicator& comm = world();
    for (int r : ranks)
      for (Work& w : isend_words(comm, words, r, kCommandLengthTag, kCommandTag)) outbox_.push_back(std::move(w));
    drop_completed(outbox_);  // a failed send throws here
    // The controller is a rank of the world too: it takes part in building a mesh over the workers.
    if (const auto* made = std::get_if<MakeMesh>(command.get()))
      meshes_.emplace_back(made->shape, made->names, std::vector<int>(made->ranks.begin(), made->ranks.end()));
  }

  uint64_t expect(const std::shared_ptr<FutureState<Tensor>>& future, int worker, const MeshSpec& mesh) override {
    return expect_reply(future, worker, mesh);
  }
  uint64_t expect(const std::shared_ptr<FutureState<Layout>>& future, int worker, const MeshSpec& mesh) override {
    return expect_reply(future, worker, mesh);
  }
  bool reports_layouts() const override { return false; }

  bool stop() override {
    for (auto& pending : unreceived_) {
      try {
        pending(true);
      } catch (const std::exception&) {
        // a reply that failed to arrive: nothing waits for it any more
      }
    }
    std::vector<int> workers(static_cast<size_t>(world_size() - 1));
    for (size_t i = 0; i < workers.size(); ++i) workers[i] = static_cast<int>(i) + 1;
    send(workers, std::make_shared<const Command>(Stop{}));
    for (const Work& w : outbox_) w.wait();
    outbox_.clear();
    return true;
  }

 private:
  // The future's value comes as the request's reply from world rank `worker`: a header (Reply),
  // then a tensor's bytes. `mesh` decodes a layout.
  template <class T>
  uint64_t expect_reply(const std::shared_ptr<FutureState<T>>& future, int worker, const MeshSpec& mesh) {
    const uint64_t request = next_request_++;
    future->pull = [worker, request, mesh](FutureState<T>& f) {
      Communicator& comm = world();
      const int tag = reply_tag(request);
      const Reply reply = decode_reply(recv_words(comm, worker, tag, tag, wait_polling));
      if (!reply.ok) return f.fail(reply.error);
      if constexpr (std::is_same_v<T, Tensor>) {
        Tensor t = empty(reply.shape, reply.dtype);
        if (t.numel() > 0) wait_polling(comm.irecv(t.raw_data(), t.numel(), t.dtype(), worker, tag));
        f.set(std::move(t));
      } else {
        f.set(WordReader(reply.layout_words, "controller").layout(mesh));
      }
    };
    // Kept (even when the caller drops the future) until received. Entries already received are
    // forgotten as new ones come.
    std::erase_if(unreceived_, [](const auto& pending) { return !pending(false); });
    unreceived_.push_back([future](bool receive) {
      if (!future->pull) return false;
      if (receive) {
        auto pull = std::move(future->pull);
        future->pull = nullptr;
        pull(*future);
      }
      return !receive;
    });
    return request;
  }

  uint64_t next_request_ = 1;
  std::vector<Work> outbox_;  // sends in flight, each keeping its buffer alive
  /// Every reply requested and not yet received: (false) whether it is still owed, (true)
  /// receives it.
  std::vector<std::function<bool(bool receive)>> unreceived_;
  std::vector<DeviceMesh> meshes_;  // the controller's handles of the workers' meshes
};

}  // namespace

std::unique_ptr<Transport> mpi_transport() { return std::make_unique<MpiTransport>(); }

}  // namespace tessera::controller::detail
