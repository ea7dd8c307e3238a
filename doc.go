// Package opkit is a small, framework-free SDK for Kubernetes operators.
//
// This file is a placeholder for the package overview; see the README.
package opkit
