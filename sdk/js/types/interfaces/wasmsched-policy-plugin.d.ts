/// <reference path="./wasmsched-policy-types.d.ts" />
declare module 'wasmsched:policy/plugin@0.2.0' {
  /**
   * Configure the plugin. `config` is the plugin's configuration text (JSON by convention, empty
   * when none was given). An error rejects the configuration and the plugin is not loaded.
   */
  export function init(config: string): PluginInfo;
  export type Stage = import('wasmsched:policy/types@0.2.0').Stage;
  export interface PluginInfo {
    /**
     * The plugin's own name, for logs and metrics.
     */
    name: string,
    /**
     * The stages this component really implements (it may export more, answering errors).
     */
    stages: Array<Stage>,
    /**
     * Version of the SDK or bindings that built it, for diagnostics.
     */
    sdkVersion: string,
  }
}
