// A Jupyter kernel's sockets, in a thread of the test: the in-memory stand-in for an ipykernel
// that lets KernelManager be tested without Python (as xeus tests its kernels against a mock
// server).  It waits for the connection file kgate writes, binds its five ports on 127.0.0.1,
// and answers as a kernel would: kernel_info and execute with busy/idle on iopub, an execute's
// code echoed as a stream (or, for the code "stream N", N outputs in quick succession),
// heartbeat echoes.  The process kgate launches for it is a plain
// `sleep`, so the kernel's life (exit, signals) is still a real process's.
#pragma once

#include <atomic>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "kgate/jupyter/connection.hpp"
#include "kgate/jupyter/wire.hpp"

namespace kgate::test {

class FakeKernel {
 public:
  explicit FakeKernel(std::filesystem::path connection_file)
      : file_(std::move(connection_file)), thread_([this] { run(); }) {}
  ~FakeKernel() {
    stop_ = true;
    thread_.join();
  }
  FakeKernel(const FakeKernel&) = delete;
  FakeKernel& operator=(const FakeKernel&) = delete;

  std::atomic<bool> answer_heartbeat{true};
  std::atomic<bool> answer_shell{true};  // false: shell requests are read and never answered

  // Every request's msg_type, in the order it came, shell and control alike.
  std::vector<std::string> requests() const {
    std::lock_guard<std::mutex> l(mu_);
    return requests_;
  }

 private:
  void run() {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!stop_ && !std::filesystem::exists(file_)) {
      if (std::chrono::steady_clock::now() > deadline) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (stop_) return;
    ConnectionInfo ci = load_connection_info(file_);
    Signer signer(ci.key, ci.signature_scheme);
    zmq::context_t ctx;
    zmq::socket_t shell(ctx, zmq::socket_type::router), control(ctx, zmq::socket_type::router),
        stdin_(ctx, zmq::socket_type::router), iopub(ctx, zmq::socket_type::pub), hb(ctx, zmq::socket_type::router);
    for (auto* s : {&shell, &control, &stdin_, &iopub, &hb}) s->set(zmq::sockopt::linger, 0);
    shell.bind(ci.endpoint(ci.shell_port));
    control.bind(ci.endpoint(ci.control_port));
    stdin_.bind(ci.endpoint(ci.stdin_port));
    iopub.bind(ci.endpoint(ci.iopub_port));
    hb.bind(ci.endpoint(ci.hb_port));
    int count = 0;

    auto send = [&](zmq::socket_t& s, std::vector<std::string> ids, const WireMessage& parent, const std::string& type,
                    const json& content) {
      WireMessage w;
      w.identities = std::move(ids);
      w.header = make_header(type, "fake-kernel").dump();
      w.parent_header = parent.header;
      w.metadata = "{}";
      w.content = content.dump();
      std::vector<zmq::const_buffer> frames;
      auto encoded = encode(w, signer);
      for (auto& f : encoded) frames.emplace_back(f.data(), f.size());
      (void)zmq::send_multipart(s, frames);
    };
    auto status = [&](const WireMessage& parent, const char* state) {
      send(iopub, {"status"}, parent, "status", {{"execution_state", state}});
    };

    while (!stop_) {
      zmq::pollitem_t items[] = {{hb.handle(), 0, ZMQ_POLLIN, 0},
                                 {shell.handle(), 0, ZMQ_POLLIN, 0},
                                 {control.handle(), 0, ZMQ_POLLIN, 0}};
      zmq::poll(items, 3, std::chrono::milliseconds(20));
      if (items[0].revents & ZMQ_POLLIN) {  // as ipykernel's heartbeat: every frame back, as it came
        std::vector<zmq::message_t> ping;
        if (zmq::recv_multipart(hb, std::back_inserter(ping)) && answer_heartbeat) (void)zmq::send_multipart(hb, ping);
      }
      for (int i : {1, 2}) {
        if (!(items[i].revents & ZMQ_POLLIN)) continue;
        zmq::socket_t& s = i == 1 ? shell : control;
        std::vector<zmq::message_t> parts;
        if (!zmq::recv_multipart(s, std::back_inserter(parts))) continue;
        std::vector<std::string_view> frames;
        for (auto& p : parts) frames.emplace_back(static_cast<const char*>(p.data()), p.size());
        WireMessage m;
        if (decode(frames, signer, m)) continue;
        const std::string type = json::parse(m.header).value("msg_type", "");
        {
          std::lock_guard<std::mutex> l(mu_);
          requests_.push_back(type);
        }
        if (i == 1 && !answer_shell) continue;
        const json content = json::parse(m.content, nullptr, false);
        status(m, "busy");
        if (type == "kernel_info_request") {
          send(s, m.identities, m, "kernel_info_reply",
               {{"status", "ok"}, {"protocol_version", "5.3"}, {"implementation", "fake"},
                {"implementation_version", "0"}, {"banner", ""}, {"language_info", {{"name", "python"}}}});
        } else if (type == "execute_request") {
          const std::string code = content.value("code", "");
          send(iopub, {"execute_input"}, m, "execute_input", {{"code", code}, {"execution_count", ++count}});
          if (code.rfind("stream ", 0) == 0) {  // "stream N": N small outputs "0\n".."N-1\n", 100 us apart
            for (int n = std::stoi(code.substr(7)), j = 0; j < n; ++j) {
              send(iopub, {"stream"}, m, "stream", {{"name", "stdout"}, {"text", std::to_string(j) + "\n"}});
              std::this_thread::sleep_for(std::chrono::microseconds(100));
            }
          } else {
            send(iopub, {"stream"}, m, "stream", {{"name", "stdout"}, {"text", code}});
          }
          send(s, m.identities, m, "execute_reply", {{"status", "ok"}, {"execution_count", count}});
        } else if (type.size() > 8 && type.compare(type.size() - 8, 8, "_request") == 0) {
          send(s, m.identities, m, type.substr(0, type.size() - 8) + "_reply", {{"status", "ok"}});
        }
        status(m, "idle");
      }
    }
  }

  std::filesystem::path file_;
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  std::vector<std::string> requests_;
  std::thread thread_;  // last: it starts once everything above is made
};

}  // namespace kgate::test
