package inboxmq

// Version is the release of inboxmq that this source tree is, in semantic
// versioning without the leading "v" (the module's tag is "v" + Version).
// It changes with each release; between releases it names the last one.
const Version = "0.1.0"
