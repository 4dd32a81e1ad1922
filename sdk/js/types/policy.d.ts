/// <reference path="./interfaces/wasmsched-policy-accelerators.d.ts" />
/// <reference path="./interfaces/wasmsched-policy-domains.d.ts" />
/// <reference path="./interfaces/wasmsched-policy-fair-share-delta.d.ts" />
/// <reference path="./interfaces/wasmsched-policy-fair-share.d.ts" />
/// <reference path="./interfaces/wasmsched-policy-filter.d.ts" />
/// <reference path="./interfaces/wasmsched-policy-host.d.ts" />
/// <reference path="./interfaces/wasmsched-policy-mirror-usage.d.ts" />
/// <reference path="./interfaces/wasmsched-policy-mirror.d.ts" />
/// <reference path="./interfaces/wasmsched-policy-placement.d.ts" />
/// <reference path="./interfaces/wasmsched-policy-plugin.d.ts" />
/// <reference path="./interfaces/wasmsched-policy-preempt.d.ts" />
/// <reference path="./interfaces/wasmsched-policy-score.d.ts" />
/// <reference path="./interfaces/wasmsched-policy-select-claim-devices.d.ts" />
/// <reference path="./interfaces/wasmsched-policy-select-devices.d.ts" />
/// <reference path="./interfaces/wasmsched-policy-topology.d.ts" />
/// <reference path="./interfaces/wasmsched-policy-types.d.ts" />
declare module 'wasmsched:policy/policy@0.2.0' {
  export type * as WasmschedPolicyAccelerators020 from 'wasmsched:policy/accelerators@0.2.0'; // import wasmsched:policy/accelerators@0.2.0
  export type * as WasmschedPolicyDomains020 from 'wasmsched:policy/domains@0.2.0'; // import wasmsched:policy/domains@0.2.0
  export type * as WasmschedPolicyHost020 from 'wasmsched:policy/host@0.2.0'; // import wasmsched:policy/host@0.2.0
  export type * as WasmschedPolicyTopology020 from 'wasmsched:policy/topology@0.2.0'; // import wasmsched:policy/topology@0.2.0
  export type * as WasmschedPolicyTypes020 from 'wasmsched:policy/types@0.2.0'; // import wasmsched:policy/types@0.2.0
  export * as plugin from 'wasmsched:policy/plugin@0.2.0'; // export wasmsched:policy/plugin@0.2.0
  export * as mirror from 'wasmsched:policy/mirror@0.2.0'; // export wasmsched:policy/mirror@0.2.0
  export * as mirrorUsage from 'wasmsched:policy/mirror-usage@0.2.0'; // export wasmsched:policy/mirror-usage@0.2.0
  export * as filter from 'wasmsched:policy/filter@0.2.0'; // export wasmsched:policy/filter@0.2.0
  export * as score from 'wasmsched:policy/score@0.2.0'; // export wasmsched:policy/score@0.2.0
  export * as placement from 'wasmsched:policy/placement@0.2.0'; // export wasmsched:policy/placement@0.2.0
  export * as selectDevices from 'wasmsched:policy/select-devices@0.2.0'; // export wasmsched:policy/select-devices@0.2.0
  export * as selectClaimDevices from 'wasmsched:policy/select-claim-devices@0.2.0'; // export wasmsched:policy/select-claim-devices@0.2.0
  export * as preempt from 'wasmsched:policy/preempt@0.2.0'; // export wasmsched:policy/preempt@0.2.0
  export * as fairShare from 'wasmsched:policy/fair-share@0.2.0'; // export wasmsched:policy/fair-share@0.2.0
  export * as fairShareDelta from 'wasmsched:policy/fair-share-delta@0.2.0'; // export wasmsched:policy/fair-share-delta@0.2.0
}
