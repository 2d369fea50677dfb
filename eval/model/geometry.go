package model

import (
	"fmt"

	"github.com/tutti-io/tutti/objmap"
)

// Geometry converts the profile's shape to the object store's geometry.
func (p Profile) Geometry() (objmap.Geometry, error) {
	dt, err := objmap.ParseDType(string(p.Shape.DType))
	if err != nil {
		return objmap.Geometry{}, fmt.Errorf("model %s: %w", p.Name, err)
	}
	s := p.Shape
	g := objmap.Geometry{Layers: s.Layers, KVHeads: s.KVHeads, HeadDim: s.HeadDim, DType: dt,
		Planes: s.Planes, PageTokens: s.PageTokens, ChunkPages: s.ChunkPages}
	if err := g.Validate(); err != nil {
		return objmap.Geometry{}, fmt.Errorf("model %s: %w", p.Name, err)
	}
	return g, nil
}

// MustGeometry is Geometry for the built-in profiles, which are valid.
func (p Profile) MustGeometry() objmap.Geometry {
	g, err := p.Geometry()
	if err != nil {
		panic(err)
	}
	return g
}
