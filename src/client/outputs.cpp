// A cell's outputs as a client sees them (see outputs.hpp).
#include "kgate/client/outputs.hpp"

namespace kgate::client {

namespace {

std::string str_field(const json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

std::size_t count_field(const json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number_unsigned() ? it->get<std::size_t>() : 0;
}

std::vector<std::string> traceback_field(const json& j) {
  std::vector<std::string> tb;
  const auto it = j.find("traceback");
  if (it == j.end() || !it->is_array()) return tb;
  for (const auto& line : *it)
    if (line.is_string()) tb.push_back(line.get<std::string>());
  return tb;
}

CellOutput error_output(const json& content) {
  CellOutput o;
  o.kind = CellOutput::Kind::error;
  o.ename = str_field(content, "ename");
  o.evalue = str_field(content, "evalue");
  o.traceback = traceback_field(content);
  return o;
}

}  // namespace

std::optional<CellOutput> output_from_iopub(std::string_view msg_type, const json& content) {
  const json& c = content.is_object() ? content : json::object();
  CellOutput o;
  if (msg_type == "stream") {
    o.kind = CellOutput::Kind::stream;
    o.name = str_field(c, "name");
    o.text = str_field(c, "text");
  } else if (msg_type == "execute_result" || msg_type == "display_data") {
    o.kind = msg_type == "display_data" ? CellOutput::Kind::display_data : CellOutput::Kind::execute_result;
    const auto data = c.find("data");
    if (data != c.end() && data->is_object()) o.data = *data;
  } else if (msg_type == "error") {
    o = error_output(c);
  } else {
    return std::nullopt;
  }
  return o;
}

std::vector<CellOutput> outputs_from_record(const json& job) {
  std::vector<CellOutput> outs;
  if (!job.is_object()) return outs;
  const std::string output = str_field(job, "output");
  const std::size_t output_cut = count_field(job, "output_cut");
  if (!output.empty() || output_cut) {
    CellOutput o;
    o.name = "output";  // stdout and stderr, interleaved as the record keeps them
    o.cut = output_cut;
    o.text = output;
    outs.push_back(std::move(o));
  }
  const std::string result = str_field(job, "result");
  const std::size_t result_cut = count_field(job, "result_cut");
  if (!result.empty() || result_cut) {
    CellOutput o;
    o.kind = CellOutput::Kind::execute_result;
    std::string text;
    if (result_cut) text = "[" + std::to_string(result_cut) + " earlier bytes of the result were cut]\n";
    o.data["text/plain"] = text + result;
    outs.push_back(std::move(o));
  }
  if (const auto err = job.find("error"); err != job.end() && err->is_object()) outs.push_back(error_output(*err));
  if (const std::string note = str_field(job, "note"); !note.empty()) {
    CellOutput o;
    o.name = "note";
    o.text = note;
    outs.push_back(std::move(o));
  }
  return outs;
}

}  // namespace kgate::client
