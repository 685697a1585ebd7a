package pool

import (
	"github.com/kvpool/kvpool/api/auth"
	kvpoolv1 "github.com/kvpool/kvpool/api/kvpool/v1"
)

// grpcRules is the access table of the gRPC door: every method the node
// serves, its operation and where its request names a tenant. A method
// missing here is refused on a secured node (TestEveryMethodHasARule
// keeps it complete).
var grpcRules = func() map[string]grpcRule {
	kv := "/" + kvpoolv1.KVPoolService_ServiceDesc.ServiceName + "/"
	adm := "/" + kvpoolv1.AdminService_ServiceDesc.ServiceName + "/"
	read := grpcRule{op: auth.OpRead, tenants: tenantField}
	write := grpcRule{op: auth.OpWrite, tenants: tenantField}
	plan := grpcRule{op: auth.OpPlan, tenants: tenantField}
	adminRead, adminWrite := grpcRule{op: auth.OpAdminRead}, grpcRule{op: auth.OpAdminWrite}
	info := grpcRule{op: auth.OpInfo}
	health := grpcRule{public: true}
	return map[string]grpcRule{
		kv + "Put": {op: auth.OpWrite, tenants: func(req any) []string {
			return []string{req.(*kvpoolv1.PutRequest).GetHeader().GetKey().GetTenant()}
		}},
		kv + "Get": read,
		kv + "BatchPut": {op: auth.OpWrite, tenants: func(req any) []string {
			items := req.(*kvpoolv1.BatchPutRequest).GetItems()
			out := make([]string, 0, len(items))
			for _, it := range items {
				out = append(out, it.GetKey().GetTenant())
			}
			return out
		}},
		kv + "BatchGet":   read,
		kv + "Exists":     read,
		kv + "Locate":     read,
		kv + "Remove":     write,
		kv + "Stats":      {op: auth.OpStats},
		kv + "Info":       info,
		kv + "ReportLoad": {op: auth.OpReportLoad},
		kv + "Fetch":      plan,
		kv + "Route":      plan,
		kv + "Estimate":   plan,
		kv + "Plan":       plan,
		// Every tenant's GPU-resident keys: peers only, as transfers.
		kv + "WatchEngineCaches": {op: auth.OpTransfer},

		adm + "ListNodes":     adminRead,
		adm + "ClusterLocate": adminRead,
		adm + "ListBlocks":    adminRead,
		adm + "ClusterStats":  adminRead,
		adm + "ListLinks":     adminRead,
		adm + "GetPolicy":     adminRead,
		adm + "ListPolicies":  adminRead,
		adm + "SetPolicy":     adminWrite,
		adm + "DeletePolicy":  adminWrite,
		adm + "Drain":         adminWrite,

		"/kvpool.transfer.v1.Transfer/Read":  {op: auth.OpTransfer},
		"/kvpool.transfer.v1.Transfer/Write": {op: auth.OpTransfer},

		"/grpc.health.v1.Health/Check": health,
		"/grpc.health.v1.Health/Watch": health,
		"/grpc.health.v1.Health/List":  health,

		"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo":      info,
		"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": info,
	}
}()
