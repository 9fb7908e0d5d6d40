// A setting's names: one table per enum gives the name of a value, the value of a name, and the
// message that lists the choices when a name is not one of them.
//
//   constexpr Named<Overlap> kOverlapNames[] = {{Overlap::None, "none"}, {Overlap::All, "all"}};
//   name_of(o, kOverlapNames);                       // "none"
//   parse_named("some", kOverlapNames, "overlap");   // throws: overlap: expected "none" or
//                                                    // "all", got "some"
#pragma once
#include <cstddef>
#include <string>

#include "tetrad/core/error.hpp"

namespace tetrad {

template <typename E>
struct Named {
  E value;
  const char* name;
};

// "?" for a value the table lacks.
template <typename E, size_t N>
const char* name_of(E value, const Named<E> (&table)[N]) {
  for (const Named<E>& n : table)
    if (n.value == value) return n.name;
  return "?";
}

// Throws tetrad::Error "`what`: expected "a", "b" or "c", got "text"" for a name not in the table.
template <typename E, size_t N>
E parse_named(const std::string& text, const Named<E> (&table)[N], const std::string& what) {
  for (const Named<E>& n : table)
    if (text == n.name) return n.value;
  std::string choices;
  for (size_t i = 0; i < N; ++i)
    choices.append(i == 0 ? "" : i + 1 == N ? " or " : ", ").append("\"").append(table[i].name).append("\"");
  fail(what, ": expected ", choices, ", got \"", text, "\"");
}

}  // namespace tetrad
