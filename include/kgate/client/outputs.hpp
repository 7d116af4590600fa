// A cell's outputs as a client sees them: from iopub messages, or from a kgate job record.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kgate/jupyter/wire.hpp"

namespace kgate::client {

// One output of a cell, as its iopub message carried it.
struct CellOutput {
  enum class Kind { stream, execute_result, display_data, error };
  Kind kind = Kind::stream;
  std::string name;                    // stream: "stdout" / "stderr"
  std::string text;                    // stream text
  std::size_t cut = 0;                 // stream: bytes cut from its front before it got here
  json data = json::object();          // execute_result / display_data: the mime bundle
  std::string ename, evalue;           // error
  std::vector<std::string> traceback;  // error
};

// From an iopub message's msg_type and content; nullopt for types that are not outputs (status,
// execute_input, clear_output, update_display_data, comms ...).  Fields of the wrong type are
// left empty rather than refused.
std::optional<CellOutput> output_from_iopub(std::string_view msg_type, const json& content);

// From a kgate job record (GET /api/kgate/jobs/{job}, README "Session records"):
//   "output" (stdout and stderr interleaved, as the record keeps them: one stream named "output",
//            its `cut` = "output_cut"),
//   "result" (an execute_result with that text/plain, likewise headed when "result_cut"),
//   "error"  ({ename, evalue, traceback} or null: an error output),
//   "note"   (why the job ended as it did, when the protocol does not say: a stream named
//            "note", so that it is never mistaken for the cell's stderr).
// Missing or null fields give no output.
std::vector<CellOutput> outputs_from_record(const json& job);

}  // namespace kgate::client
