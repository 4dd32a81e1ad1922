/// <reference path="./wasmsched-policy-types.d.ts" />
declare module 'wasmsched:policy/filter@0.2.0' {
  /**
   * `candidates` are mirror slots. An error is a plugin fault (the host applies the plugin's
   * failure policy), not a rejection.
   * 
   * A verdict must depend only on the task, the candidate's node record (and its topology) and
   * the plugin's configuration: the host reuses it for an equal task (the same record apart from
   * `id`) on the same node in the same state, without calling again. A filter that needs more
   * is marked `reuse_verdicts: false` in its policy set.
   */
  export function filter(task: Task, candidates: Uint32Array): FilterResult;
  export type Task = import('wasmsched:policy/types@0.2.0').Task;
  export type Rejection = import('wasmsched:policy/types@0.2.0').Rejection;
  /**
   * One verdict per candidate, compactly: `codes[i]` = 0 means `candidates[i]` fits; `k > 0`
   * means it does not, for `reasons[k - 1]`. Reasons are shared between nodes.
   */
  export interface FilterResult {
    codes: Uint16Array,
    reasons: Array<Rejection>,
  }
}
