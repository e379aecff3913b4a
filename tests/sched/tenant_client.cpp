// mc_test_tenant_client: one conductor.submit as a chosen identity, with every field the wire allows (the tests'
// stand-in for another tenant's hand-made client, docs/SECURITY.md "Request ids"). Not installed.
//   mc_test_tenant_client KEYS NAME CONDUCTOR ID INPUT_TOKENS OUTPUT_TOKENS CLIENT_ENDPOINT
// Prints the reply as one JSON line; exit 0 accepted, 3 rejected, 1 an error (printed), 2 usage.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "mc/net/auth.hpp"
#include "mc/net/rpc.hpp"
#include "mc/proto/conductor.hpp"

int main(int argc, char** argv) {
  if (argc != 8) {
    std::cerr << "usage: mc_test_tenant_client KEYS NAME CONDUCTOR ID INPUT_TOKENS OUTPUT_TOKENS CLIENT_ENDPOINT\n";
    return 2;
  }
  auto ring = mc::auth::Keyring::load(argv[1], argv[2]);
  if (!ring.is_ok() || !mc::auth::set_process_keyring(ring.value()).is_ok()) {
    std::cout << "keys: " << ring.status().to_string() << "\n";
    return 1;
  }
  auto client = mc::rpc::RpcClient::connect(argv[3]);
  if (!client.is_ok()) {
    std::cout << client.status().to_string() << "\n";
    return 1;
  }
  mc::proto::ConductorSubmitRequest r;
  r.request_id = argv[4];
  r.input_tokens = std::atoll(argv[5]);
  r.output_tokens = std::atoll(argv[6]);
  for (int64_t i = 0; i < r.input_tokens; ++i) r.tokens.push_back(static_cast<uint32_t>((i * 7 + 3) % 1000));
  r.client_endpoint = argv[7];
  auto reply = (*client)->call(r, 30'000);
  if (!reply.is_ok()) {
    std::cout << reply.status().to_string() << "\n";
    return 1;
  }
  std::cout << nlohmann::json{{"request_id", reply->request_id},
                              {"accepted", reply->accepted},
                              {"reason", reply->reason},
                              {"decode_id", reply->decode_id}}
                   .dump()
            << "\n";
  return reply->accepted ? 0 : 3;
}
