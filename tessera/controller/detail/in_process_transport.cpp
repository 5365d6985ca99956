// Workers as threads of this process: each worker is a rank of one in-process world (its own
// thread), fed through its WorkerPort; answers go straight into the controller's futures.
#include <cstdio>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <variant>

#include <tessera/controller/detail/transport.hpp>
#include <tessera/controller/detail/worker.hpp>
#include <tessera/core/error.hpp>
#include <tessera/runtime/runtime.hpp>

namespace tessera::controller::detail {

namespace {

// The futures waiting for an answer, by request id: the controller registers one, a worker's
// answer takes it.
class ReplyBoard final : public ReplySink {
 public:
  template <class T>
  uint64_t expect(const std::shared_ptr<FutureState<T>>& future) {
    std::lock_guard<std::mutex> lock(mutex_);
    const uint64_t request = next_request_++;
    waiting_.emplace(request, future);
    return request;
  }
  void tensor(uint64_t request, const Tensor& t) override { answer<Tensor>(request, t); }
  void layout(uint64_t request, const Layout& layout) override { answer<Layout>(request, layout); }
  void error(uint64_t request, const std::string& message) override {
    if (const std::optional<Waiting> future = take(request))
      std::visit([&](const auto& waiting) { waiting->fail(message); }, *future);
  }

 private:
  using Waiting = std::variant<std::shared_ptr<FutureState<Tensor>>, std::shared_ptr<FutureState<Layout>>>;

  // The future waiting for `request`; none when it was answered already (a stream that failed
  // after answering answers again with its error: the first answer stands, as FutureState's).
  std::optional<Waiting> take(uint64_t request) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = waiting_.find(request);
    if (it == waiting_.end()) return std::nullopt;
    Waiting future = std::move(it->second);
    waiting_.erase(it);
    return future;
  }
  template <class T>
  void answer(uint64_t request, const T& value) {
    const std::optional<Waiting> future = take(request);
    if (!future) return;
    const auto* waiting = std::get_if<std::shared_ptr<FutureState<T>>>(&*future);
    TESSERA_ASSERT(waiting != nullptr, "request ", request, " is answered with another kind of value");
    (*waiting)->set(value);
  }

  std::mutex mutex_;
  uint64_t next_request_ = 1;
  std::unordered_map<uint64_t, Waiting> waiting_;
};

class InProcessTransport final : public Transport {
 public:
  InProcessTransport(int workers, std::shared_ptr<Health> health) : health_(std::move(health)) {
    for (int r = 0; r < workers; ++r) ports_.push_back(std::make_unique<WorkerPort>());
    // The workers: one in-process world running its queues until stopped.
    pool_ = std::thread([this, workers] {
      try {
        launch(workers, [this] { worker_loop(*ports_[static_cast<size_t>(rank())], *health_, board_); });
      } catch (const std::exception& e) {
        failure_ = e.what();
        health_->fail(failure_);
      } catch (...) {
        failure_ = "a non-standard exception";
        health_->fail(failure_);
      }
    });
  }
  ~InProcessTransport() override {
    if (pool_.joinable()) stop();
  }

  int first_worker() const override { return 0; }
  void send(const std::vector<int>& ranks, std::shared_ptr<const Command> command) override {
    for (int r : ranks) ports_[static_cast<size_t>(r)]->route(command);
  }
  uint64_t expect(const std::shared_ptr<FutureState<Tensor>>& future, int, const MeshSpec&) override {
    return board_.expect(future);
  }
  uint64_t expect(const std::shared_ptr<FutureState<Layout>>& future, int, const MeshSpec&) override {
    return board_.expect(future);
  }
  bool reports_layouts() const override { return true; }
  bool stop() override {
    const auto stop = std::make_shared<const Command>(Stop{});
    for (auto& port : ports_) port->route(stop);
    pool_.join();
    if (failure_.empty()) return true;
    std::fprintf(stderr, "controller: a worker failed: %s\n", failure_.c_str());
    return false;
  }

 private:
  std::shared_ptr<Health> health_;
  std::vector<std::unique_ptr<WorkerPort>> ports_;
  ReplyBoard board_;
  std::thread pool_;
  std::string failure_;  // written by the pool's thread before it ends
};

}  // namespace

std::unique_ptr<Transport> in_process_transport(int workers, std::shared_ptr<Health> health) {
  return std::make_unique<InProcessTransport>(workers, std::move(health));
}

}  // namespace tessera::controller::detail
