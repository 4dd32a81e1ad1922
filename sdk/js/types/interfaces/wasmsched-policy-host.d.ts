declare module 'wasmsched:policy/host@0.2.0' {
  /**
   * Log through the host's tracing, attributed to the plugin. Rate-limited and truncated by the host.
   */
  export function log(level: LogLevel, message: string): void;
  /**
   * # Variants
   * 
   * ## `"trace"`
   * 
   * ## `"debug"`
   * 
   * ## `"info"`
   * 
   * ## `"warn"`
   * 
   * ## `"error"`
   */
  export type LogLevel = 'trace' | 'debug' | 'info' | 'warn' | 'error';
}
