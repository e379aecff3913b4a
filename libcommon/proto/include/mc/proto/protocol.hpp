// Every section of the protocol at once: for the round-trip tests and the fuzz harnesses, which decode every
// message. Everything else includes the one section it uses (envelope.hpp says why and lists them).
#pragma once

#include "mc/proto/conductor.hpp"
#include "mc/proto/envelope.hpp"
#include "mc/proto/kv_events.hpp"
#include "mc/proto/store.hpp"
#include "mc/proto/transfer.hpp"
#include "mc/proto/worker.hpp"
