// MasterCore (master_core.hpp): quotas per tenant (docs/SECURITY.md "Quotas (issue 51)"). The class is split across
// master_*.cpp by its header's paragraphs.
#include <algorithm>
#include <cmath>
#include <optional>

#include "master_core_internal.hpp"
#include "mc/common/units.hpp"
#include "mc/store/master_core.hpp"

namespace mc::store {

namespace {

uint64_t sub(uint64_t a, uint64_t b) { return a >= b ? a - b : 0; }

void apply(TenantUsage& u, const TenantUsage& d, int sign) {
  const auto one = [sign](uint64_t& v, uint64_t by) { v = sign > 0 ? v + by : sub(v, by); };
  one(u.bytes, d.bytes);
  one(u.pinned_bytes, d.pinned_bytes);
  one(u.puts, d.puts);
  one(u.put_bytes, d.put_bytes);
  one(u.objects, d.objects);
  one(u.held_bytes, d.held_bytes);
}

std::string limit_text(uint64_t v) { return v == kQuotaNone ? "none" : std::to_string(v); }

}  // namespace

Result<QuotaLimits> parse_quota_limits(std::string_view text, const QuotaLimits& base) {
  QuotaLimits q = base;
  const auto bad = [&](std::string_view item, const std::string& why) {
    return Status(Code::kInvalidArgument,
                  "quota item '" + std::string(item) + "': " + why +
                      " (items: bytes:SIZE, pinned:SIZE, puts:N, put-bytes:SIZE, objects:N; SIZE as 64MiB or 1GiB; "
                      "'default' for the default)");
  };
  if (text.empty()) return bad(text, "empty");
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    const std::string_view item = text.substr(pos, comma - pos);
    const size_t colon = item.find(':');
    if (colon == std::string_view::npos) return bad(item, "not NAME:VALUE");
    const std::string_view name = item.substr(0, colon), value = item.substr(colon + 1);
    uint64_t* field = name == "bytes"       ? &q.bytes
                      : name == "pinned"    ? &q.pinned_bytes
                      : name == "puts"      ? &q.puts
                      : name == "put-bytes" ? &q.put_bytes
                      : name == "objects"   ? &q.objects
                                            : nullptr;
    if (field == nullptr) return bad(item, "unknown quota '" + std::string(name) + "'");
    if (value == "default") {
      *field = kQuotaDefault;
    } else {
      const bool sized = name == "bytes" || name == "pinned" || name == "put-bytes";
      Result<int64_t> v = sized ? units::parse_size_bytes(value) : units::parse_count(value);
      if (!v.is_ok()) return bad(item, v.status().message());
      if (*v < 0) return bad(item, "negative");
      *field = static_cast<uint64_t>(*v);
    }
    pos = comma + 1;
  }
  return q;
}

Result<std::pair<std::string, QuotaLimits>> parse_tenant_quota(std::string_view text) {
  const size_t eq = text.find('=');
  if (eq == std::string_view::npos || eq == 0) {
    return Status(Code::kInvalidArgument,
                  "quota '" + std::string(text) + "': not TENANT=LIMITS (e.g. alice=bytes:2GiB,pinned:1GiB,puts:64)");
  }
  MC_ASSIGN_OR_RETURN(QuotaLimits q, parse_quota_limits(text.substr(eq + 1)));
  return std::make_pair(std::string(text.substr(0, eq)), q);
}

void MasterCore::account(const Object& obj, int sign) {
  if (obj.owner.empty()) return;
  TenantUsage d;
  d.bytes = obj.charged_bytes;
  d.pinned_bytes = obj.pinned ? obj.charged_bytes : 0;
  d.puts = obj.complete ? 0 : 1;
  d.put_bytes = obj.complete ? 0 : obj.charged_bytes;
  d.objects = 1;
  d.held_bytes = obj.pinned || !obj.complete ? obj.charged_bytes : 0;
  apply(tenants_[obj.owner].usage, d, sign);
}

TenantUsage MasterCore::effective_limits(const std::string& tenant) const {
  QuotaLimits set;
  if (auto t = tenants_.find(tenant); t != tenants_.end()) set = t->second.limits;
  uint64_t share = kQuotaNone;
  if (config_.quota_default_share > 0) {
    uint64_t dram = 0;
    for (const auto& [name, seg] : segments_) {
      if (seg.info.medium == Medium::kCpu) dram += seg.alloc->capacity_bytes();
    }
    share = static_cast<uint64_t>(std::floor(config_.quota_default_share * static_cast<double>(dram)));
  }
  const auto pick = [](uint64_t v, uint64_t dflt) { return v == kQuotaDefault ? dflt : v; };
  TenantUsage l;
  l.bytes = pick(set.bytes, kQuotaNone);
  l.pinned_bytes = pick(set.pinned_bytes, share);
  l.puts = pick(set.puts, kQuotaNone);
  l.put_bytes = pick(set.put_bytes, share);
  l.objects = pick(set.objects, kQuotaNone);
  return l;
}

Status MasterCore::check_quota(const std::string& key, const std::string& tenant, uint64_t charged, bool pin,
                               const Object* replaced, bool pin_only) {
  if (tenant.empty()) return Status::ok();
  TenantUsage u;
  if (auto t = tenants_.find(tenant); t != tenants_.end()) u = t->second.usage;
  if (replaced != nullptr && replaced->owner == tenant) {
    TenantUsage d;
    d.bytes = replaced->charged_bytes;
    d.pinned_bytes = replaced->pinned ? replaced->charged_bytes : 0;
    d.held_bytes = d.pinned_bytes;
    d.objects = 1;  // a complete object: no unfinished put to credit
    apply(u, d, -1);
  }
  const TenantUsage l = effective_limits(tenant);
  QuotaLimits set;
  if (auto t = tenants_.find(tenant); t != tenants_.end()) set = t->second.limits;
  const auto over = [&](const char* what, const char* item, uint64_t used, uint64_t asked, uint64_t limit,
                        bool by_default) -> std::optional<Status> {
    if (limit == kQuotaNone || used + asked <= limit) return std::nullopt;
    ++tenants_[tenant].refused;
    return Status(Code::kResourceExhausted,
                  std::string(pin_only ? "pin '" : "put '") + key + "' refused: tenant '" + tenant +
                      "' is over its quota of " + what + ": " + std::to_string(used) + " in use + " +
                      std::to_string(asked) + " asked > limit " + limit_text(limit) +
                      (by_default ? " (the default with keys: " +
                                        std::to_string(static_cast<int>(config_.quota_default_share * 100)) +
                                        "% of the pool's DRAM capacity)"
                                  : std::string()) +
                      "; remove, unpin or finish objects, or ask the admin to raise it (mc-store quota set " + tenant +
                      " " + item + ":...)");
  };
  // With both left at the default, what a tenant holds that eviction cannot take (pinned bytes and unfinished puts)
  // is bounded together by the default share, so one tenant never holds the whole pool with half in each (a tester's
  // finding). Each object counts once, pinned or unfinished or both (TenantUsage::held_bytes).
  const auto held_together = [&]() -> std::optional<Status> {
    if (set.pinned_bytes != kQuotaDefault || set.put_bytes != kQuotaDefault || l.pinned_bytes == kQuotaNone) {
      return std::nullopt;
    }
    return over("pinned and unfinished put bytes together", "pinned", u.held_bytes, charged, l.pinned_bytes, true);
  };
  if (pin_only) {
    if (auto s = over("pinned bytes", "pinned", u.pinned_bytes, charged, l.pinned_bytes,
                      set.pinned_bytes == kQuotaDefault)) {
      return *s;
    }
    if (auto s = held_together()) return *s;
    return Status::ok();
  }
  if (auto s = over("objects", "objects", u.objects, 1, l.objects, false)) return *s;
  if (auto s = over("unfinished puts", "puts", u.puts, 1, l.puts, false)) return *s;
  if (auto s = over("unfinished put bytes", "put-bytes", u.put_bytes, charged, l.put_bytes,
                    set.put_bytes == kQuotaDefault)) {
    return *s;
  }
  if (auto s = over("bytes", "bytes", u.bytes, charged, l.bytes, false)) return *s;
  if (pin) {
    if (auto s = over("pinned bytes", "pinned", u.pinned_bytes, charged, l.pinned_bytes,
                      set.pinned_bytes == kQuotaDefault)) {
      return *s;
    }
  }
  if (auto s = held_together()) return *s;
  return Status::ok();
}

Status MasterCore::set_quota(const std::string& tenant, const QuotaLimits& limits) {
  if (tenant.empty()) return Status(Code::kInvalidArgument, "quota: empty tenant name");
  if (tenant.size() > 64) return Status(Code::kInvalidArgument, "quota: tenant name over 64 bytes");
  tenants_[tenant].limits = limits;
  return Status::ok();
}

QuotaLimits MasterCore::quota(const std::string& tenant) const {
  auto t = tenants_.find(tenant);
  return t == tenants_.end() ? QuotaLimits{} : t->second.limits;
}

std::vector<TenantStats> MasterCore::tenant_stats() const {
  std::vector<TenantStats> out;
  for (const auto& [name, t] : tenants_) {
    TenantStats s;
    s.tenant = name;
    s.usage = t.usage;
    s.limits = effective_limits(name);
    s.set = t.limits;
    s.refused = t.refused;
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace mc::store
