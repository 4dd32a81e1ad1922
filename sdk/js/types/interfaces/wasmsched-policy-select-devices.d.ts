/// <reference path="./wasmsched-policy-types.d.ts" />
declare module 'wasmsched:policy/select-devices@0.2.0' {
  export function selectDevices(task: Task, node: number): Result<Array<DeviceShare>, Rejection>;
  export type Task = import('wasmsched:policy/types@0.2.0').Task;
  export type Rejection = import('wasmsched:policy/types@0.2.0').Rejection;
  export interface DeviceShare {
    /**
     * `gpu-device.index` on the node.
     */
    gpu: number,
    milli: number,
  }
  export type Result<T, E> = { tag: 'ok', val: T } | { tag: 'err', val: E };
}
