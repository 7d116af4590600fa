// A tool call's arguments checked against the tool's inputSchema (jsonrpc.hpp check_arguments).
#include "session.hpp"

namespace kgate::mcp {

// ---------------------------------------------------------------------------------------
// Arguments against a tool's inputSchema

namespace {

std::string type_of(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "integer";
  if (v.is_number()) return "number";
  if (v.is_string()) return "string";
  if (v.is_array()) return "array";
  return "object";
}

bool has_type(const json& v, const std::string& type) {
  if (type == "number") return v.is_number();
  if (type == "integer") {
    if (v.is_number_integer() || v.is_number_unsigned()) return true;
    return v.is_number_float() && std::isfinite(v.get<double>()) && std::trunc(v.get<double>()) == v.get<double>();
  }
  return type_of(v) == type;
}

std::string article(const std::string& type) {
  return (type == "integer" || type == "array" || type == "object" ? "an " : "a ") + type;
}

// The value as the message shows it: JSON, cut to a few dozen characters.
std::string shown(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 40) {
    std::size_t cut = 37;
    while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;  // not inside a character
    s = s.substr(0, cut) + "...";
  }
  return s;
}

std::string number_text(const json& n) { return n.dump(); }

std::size_t code_points(const std::string& s) {
  return static_cast<std::size_t>(std::count_if(s.begin(), s.end(), [](char c) {
    return (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  }));
}

void check_value(const json& schema, const json& v, const std::string& where, std::vector<std::string>& out);

void check_object(const json& schema, const json& v, const std::string& where, std::vector<std::string>& out) {
  const json empty = json::object();
  const auto props_it = schema.find("properties");
  const json& props = props_it != schema.end() && props_it->is_object() ? *props_it : empty;
  auto name_of = [&](const std::string& key) { return where.empty() ? "'" + key + "'" : "'" + where + "." + key + "'"; };
  if (const auto req = schema.find("required"); req != schema.end() && req->is_array()) {
    for (const json& r : *req) {
      if (!r.is_string() || v.contains(r.get<std::string>())) continue;
      std::string what;
      if (const auto p = props.find(r.get<std::string>()); p != props.end() && p->is_object()) {
        if (const auto t = p->find("type"); t != p->end() && t->is_string()) what = " (" + article(t->get<std::string>()) + ")";
      }
      out.push_back(name_of(r.get<std::string>()) + what + " is required");
    }
  }
  const auto extra = schema.find("additionalProperties");
  for (const auto& [key, value] : v.items()) {
    if (const auto p = props.find(key); p != props.end()) {
      check_value(*p, value, where.empty() ? key : where + "." + key, out);
    } else if (extra != schema.end() && extra->is_boolean() && !extra->get<bool>()) {
      std::string known;
      for (const auto& [name, ignored] : props.items()) known += (known.empty() ? "" : ", ") + name;
      out.push_back("unknown argument " + name_of(key) +
                    (known.empty() ? " (this tool takes no arguments)" : " (the arguments are: " + known + ")"));
    } else if (extra != schema.end() && extra->is_object()) {
      check_value(*extra, value, where.empty() ? key : where + "." + key, out);
    }
  }
}

void check_value(const json& schema, const json& v, const std::string& where, std::vector<std::string>& out) {
  if (!schema.is_object()) return;  // `true` and other trivial schemas accept anything
  const std::string name = where.empty() ? "the arguments" : "'" + where + "'";
  if (const auto t = schema.find("type"); t != schema.end()) {
    std::vector<std::string> types;
    if (t->is_string()) types.push_back(t->get<std::string>());
    if (t->is_array())
      for (const json& e : *t)
        if (e.is_string()) types.push_back(e.get<std::string>());
    if (!types.empty() && std::none_of(types.begin(), types.end(), [&](const std::string& ty) { return has_type(v, ty); })) {
      std::string want;
      for (std::size_t i = 0; i < types.size(); ++i)
        want += (i == 0 ? "" : i + 1 == types.size() ? " or " : ", ") + article(types[i]);
      out.push_back(name + " must be " + want + ", not " + article(type_of(v)) + " (" + shown(v) + ")");
      return;  // the other keywords say nothing useful about a value of the wrong type
    }
  }
  if (const auto e = schema.find("enum"); e != schema.end() && e->is_array() &&
                                          std::find(e->begin(), e->end(), v) == e->end()) {
    std::string list;
    for (const json& option : *e) list += (list.empty() ? "" : ", ") + shown(option);
    out.push_back(name + " must be one of " + list + ", not " + shown(v));
  }
  if (const auto c = schema.find("const"); c != schema.end() && *c != v)
    out.push_back(name + " must be " + shown(*c) + ", not " + shown(v));
  if (v.is_number()) {
    const double x = v.get<double>();
    auto bound = [&](const char* key, const char* words, auto ok) {
      if (const auto b = schema.find(key); b != schema.end() && b->is_number() && !ok(x, b->get<double>()))
        out.push_back(name + " must be " + words + " " + number_text(*b) + ", not " + shown(v));
    };
    bound("minimum", "at least", [](double a, double b) { return a >= b; });
    bound("maximum", "at most", [](double a, double b) { return a <= b; });
    bound("exclusiveMinimum", "greater than", [](double a, double b) { return a > b; });
    bound("exclusiveMaximum", "less than", [](double a, double b) { return a < b; });
  }
  // A count keyword (minLength, maxItems, ...): a non-negative integer, or none.
  auto count = [&](const char* key) -> std::optional<std::size_t> {
    const auto b = schema.find(key);
    if (b == schema.end() || !b->is_number_integer() || b->get<long long>() < 0) return std::nullopt;
    return b->get<std::size_t>();
  };
  if (v.is_string()) {
    const std::size_t n = code_points(v.get_ref<const std::string&>());
    if (auto b = count("minLength"); b && n < *b)
      out.push_back(name + " must be at least " + std::to_string(*b) + " characters long");
    if (auto b = count("maxLength"); b && n > *b)
      out.push_back(name + " must be at most " + std::to_string(*b) + " characters long, not " + std::to_string(n));
  }
  if (v.is_array()) {
    if (auto b = count("minItems"); b && v.size() < *b)
      out.push_back(name + " must have at least " + std::to_string(*b) + " items");
    if (auto b = count("maxItems"); b && v.size() > *b)
      out.push_back(name + " must have at most " + std::to_string(*b) + " items, not " + std::to_string(v.size()));
    if (const auto items = schema.find("items"); items != schema.end())
      for (std::size_t i = 0; i < v.size(); ++i) check_value(*items, v[i], where + "[" + std::to_string(i) + "]", out);
  }
  if (v.is_object()) check_object(schema, v, where, out);
}

}  // namespace

std::string check_arguments(const json& schema, const json& arguments) {
  std::vector<std::string> problems;
  check_value(schema, arguments, "", problems);
  std::string text;
  for (const std::string& p : problems) text += (text.empty() ? "" : " ") + p + ".";
  return text;
}

}  // namespace kgate::mcp
