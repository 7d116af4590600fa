// Channel names and the messages kgate makes itself (see messages.hpp).
#include "kgate/jupyter/messages.hpp"

namespace kgate {

std::string_view channel_name(Channel c) noexcept {
  switch (c) {
    case Channel::shell: return "shell";
    case Channel::control: return "control";
    case Channel::stdin_: return "stdin";
    case Channel::iopub: return "iopub";
  }
  return "shell";
}

std::optional<Channel> parse_channel(std::string_view name) noexcept {
  if (name == "shell") return Channel::shell;
  if (name == "control") return Channel::control;
  if (name == "stdin") return Channel::stdin_;
  if (name == "iopub") return Channel::iopub;
  return std::nullopt;
}

KernelMessage synthesize_message(Channel channel, std::string_view msg_type,
                                 std::string_view session, std::string parent_header,
                                 const json& content) {
  KernelMessage m;
  m.channel = channel;
  m.synthesized = true;
  m.msg_type = std::string(msg_type);
  json header = make_header(msg_type, session);
  m.msg_id = header["msg_id"].get<std::string>();
  json parent = json::parse(parent_header, nullptr, false);
  if (parent.is_object()) m.parent_msg_id = parent.value("msg_id", "");
  m.wire.header = header.dump();
  m.wire.parent_header = std::move(parent_header);
  m.wire.metadata = "{}";
  m.wire.content = content.dump();
  return m;
}

}  // namespace kgate
