// MC_MESSAGE(fields...): a protocol struct's msgpack map encoding, field names as keys (DESIGN.md §4).
//
// The bytes are those of msgpack-c's MSGPACK_DEFINE_MAP: a map of the fields in declaration order, each key the
// field's name as a str. Decoding follows it too: a body that is not a map, or a map with a key that is not a
// str, throws msgpack::type_error (codec.hpp turns it into kMalformedMessage); a missing field keeps its default;
// an unknown key is skipped; of two equal keys the first counts; a field of the wrong type throws.
//
// Why not MSGPACK_DEFINE_MAP itself: its msgpack_unpack is an ordinary inline member, so every struct's whole
// decoder (msgpack-c's define_map tuple machinery for all its fields) is instantiated in every translation unit
// that includes the struct. Over the protocol's sections that cost about 15 s of compile time per file (GCC 12,
// 2026-12-07, docs/BENCHMARKS.md "Build and test time"). Here every member is a template over a deferred
// parameter, so a file pays only for the messages it encodes or decodes.
//
// Thread-safety: none needed (functions of their arguments). Errors: msgpack-c exceptions, as above.
#pragma once

#include <cstdint>
#include <cstring>

#include <msgpack.hpp>

namespace mc::proto::detail {

// Counts the fields of a message (the map's size).
struct FieldCounter {
  uint32_t n = 0;
  template <typename T>
  void operator()(const char* /*name*/, const T& /*field*/) {
    ++n;
  }
};

template <typename Packer, typename T>
void pack_map(Packer& pk, const T& message) {
  FieldCounter count;
  message.mc_each_field(count);
  pk.pack_map(count.n);
  message.mc_each_field([&pk](const char* name, const auto& field) {
    pk.pack(name);
    pk.pack(field);
  });
}

template <typename Deferred, typename T>
void unpack_map(const msgpack::object& o, T& message) {
  if (o.type != msgpack::type::MAP) {
    throw msgpack::type_error();
  }
  const msgpack::object_kv* kv = o.via.map.ptr;
  const uint32_t size = o.via.map.size;
  for (uint32_t i = 0; i < size; ++i) {
    if (kv[i].key.type != msgpack::type::STR) {
      throw msgpack::type_error();
    }
  }
  message.mc_each_field([kv, size](const char* name, auto& field) {
    const size_t name_size = std::strlen(name);
    for (uint32_t i = 0; i < size; ++i) {  // the first equal key counts
      const msgpack::object_str& key = kv[i].key.via.str;
      if (key.size == name_size && std::memcmp(key.ptr, name, name_size) == 0) {
        msgpack::v1::type::convert_helper(kv[i].val, field);
        return;
      }
    }
  });
}

template <typename Object, typename T>
void object_map(Object* o, msgpack::zone& z, const T& message) {
  FieldCounter count;
  message.mc_each_field(count);
  o->type = msgpack::type::MAP;
  o->via.map.size = count.n;
  o->via.map.ptr = static_cast<msgpack::object_kv*>(
      z.allocate_align(sizeof(msgpack::object_kv) * count.n, MSGPACK_ZONE_ALIGNOF(msgpack::object_kv)));
  uint32_t i = 0;
  message.mc_each_field([&](const char* name, const auto& field) {
    o->via.map.ptr[i].key = msgpack::object(name, z);
    o->via.map.ptr[i].val = msgpack::object(field, z);
    ++i;
  });
}

}  // namespace mc::proto::detail

#define MC_MESSAGE_VISIT_FIELD(r, visitor, field) visitor(MSGPACK_PP_STRINGIZE(field), field);

// Inside a struct: MC_MESSAGE(a, b, c) lists the fields that travel, by name.
#define MC_MESSAGE(...)                                                                                  \
  template <typename Visitor>                                                                            \
  void mc_each_field(Visitor&& mc_visitor) {                                                             \
    MSGPACK_PP_SEQ_FOR_EACH(MC_MESSAGE_VISIT_FIELD, mc_visitor, MSGPACK_PP_VARIADIC_TO_SEQ(__VA_ARGS__)) \
  }                                                                                                      \
  template <typename Visitor>                                                                            \
  void mc_each_field(Visitor&& mc_visitor) const {                                                       \
    MSGPACK_PP_SEQ_FOR_EACH(MC_MESSAGE_VISIT_FIELD, mc_visitor, MSGPACK_PP_VARIADIC_TO_SEQ(__VA_ARGS__)) \
  }                                                                                                      \
  template <typename Packer>                                                                             \
  void msgpack_pack(Packer& msgpack_pk) const {                                                          \
    ::mc::proto::detail::pack_map(msgpack_pk, *this);                                                    \
  }                                                                                                      \
  template <typename Deferred = void>                                                                    \
  void msgpack_unpack(const msgpack::object& msgpack_o) {                                                \
    ::mc::proto::detail::unpack_map<Deferred>(msgpack_o, *this);                                         \
  }                                                                                                      \
  template <typename Object>                                                                             \
  void msgpack_object(Object* msgpack_o, msgpack::zone& msgpack_z) const {                               \
    ::mc::proto::detail::object_map(msgpack_o, msgpack_z, *this);                                        \
  }
