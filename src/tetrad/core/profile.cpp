#include "tetrad/core/profile.hpp"

#include <cstdio>

namespace tetrad {

namespace {
std::string json_string(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      o += buf;
    } else {
      o += c;
    }
  }
  return o + "\"";
}
}  // namespace

std::string TraceLog::json_events(int rank) const {
  std::string out;
  char num[64];
  auto sep = [&] {
    if (!out.empty()) out += ",\n";
  };
  // Metadata: the process is the rank, its threads are the tracks (compute first).
  sep();
  out += "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":" + std::to_string(rank) +
         ",\"tid\":0,\"args\":{\"name\":\"rank " + std::to_string(rank) + "\"}}";
  for (size_t t = 0; t < tracks.size(); ++t) {
    const std::string name = t == 0 ? "compute" : "comm " + tracks[t];
    sep();
    out += "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":" + std::to_string(rank) +
           ",\"tid\":" + std::to_string(t) + ",\"args\":{\"name\":" + json_string(name) + "}}";
    sep();
    out += "{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":" + std::to_string(rank) +
           ",\"tid\":" + std::to_string(t) + ",\"args\":{\"sort_index\":" + std::to_string(t) + "}}";
  }
  for (const TraceEvent& e : events) {
    sep();
    out += "{\"ph\":\"X\",\"pid\":" + std::to_string(rank) + ",\"tid\":" + std::to_string(e.track) +
           ",\"name\":" + json_string(e.name);
    std::snprintf(num, sizeof num, ",\"ts\":%.3f,\"dur\":%.3f", e.ts, e.dur);
    out += num;
    out += ",\"cat\":\"";
    out += e.track == 0 ? "compute" : "comm";
    out += "\"";
    if (!e.args.empty()) out += ",\"args\":{" + e.args + "}";
    out += "}";
  }
  return out;
}

}  // namespace tetrad
