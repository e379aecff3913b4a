#include "mc/store/master_link.hpp"

#include "mc/common/log.hpp"

namespace mc::store {

// ---------------------------------------------------------------------------------------------

MasterLink::MasterLink(std::shared_ptr<MasterLocator> locator, rpc::ClientOptions options)
    : locator_(std::move(locator)), options_(std::move(options)) {}

Result<std::unique_ptr<MasterLink>> MasterLink::connect(std::shared_ptr<MasterLocator> locator,
                                                        rpc::ClientOptions options) {
  std::unique_ptr<MasterLink> link(new MasterLink(std::move(locator), std::move(options)));
  MC_RETURN_IF_ERROR(link->reconnect(link->options_.connect_timeout_ms));
  return link;
}

Status MasterLink::reconnect(int64_t wait_ms) {
  const uint64_t gen = locator_->generation();
  MC_ASSIGN_OR_RETURN(LeaderInfo l, locator_->leader(wait_ms));
  conn_.reset();
  endpoint_ = l.endpoint;
  leader_ = l;
  generation_ = gen;
  rpc::ClientOptions co = options_;
  co.connect_timeout_ms = static_cast<int>(std::max<int64_t>(100, std::min<int64_t>(wait_ms, co.connect_timeout_ms)));
  MC_ASSIGN_OR_RETURN(conn_, rpc::RpcClient::connect(l.endpoint, co));
  return Status::ok();
}

bool MasterLink::follow() {
  if (!locator_->follows_etcd() || locator_->generation() == generation_) return false;
  const std::string before = endpoint_;
  Status s = reconnect(options_.connect_timeout_ms);
  if (!s.is_ok()) {
    MC_LOG_WARN << options_.client_name << ": the store master changed and the new one is not reachable yet ("
                << s.message() << ")";
    conn_.reset();
    return false;
  }
  if (endpoint_ != before) {
    MC_LOG_INFO << options_.client_name << ": following the store master leader " << endpoint_ << " (was "
                << (before.empty() ? "none" : before) << ")";
  }
  return true;
}

}  // namespace mc::store
